// Proves the emulator's toolchain before anything is built on it: clang with
// GCC's Objective-C runtime (-fobjc-runtime=gcc), blocks, and GNUstep's
// NSObject/NSString/NSError with manual retain/release (ARC off, as the .mm).
#import <Foundation/Foundation.h>

static int g_deallocs = 0;

@interface MuserToolchainThing : NSObject {
  int _n;
}
- (instancetype)initWithN:(int)n;
- (int)n;
@end

@implementation MuserToolchainThing
- (instancetype)initWithN:(int)n {
  if ((self = [super init])) _n = n;
  return self;
}
- (int)n { return _n; }
- (void)dealloc {
  ++g_deallocs;
  [super dealloc];
}
@end

int main(void) {
  NSAutoreleasePool* pool = [[NSAutoreleasePool alloc] init];
  MuserToolchainThing* t = [[MuserToolchainThing alloc] initWithN:7];
  [t retain];
  [t release];
  [[[MuserToolchainThing alloc] initWithN:1] autorelease];
  NSString* s = [NSString stringWithFormat:@"n=%d", [t n]];
  NSError* e = [NSError errorWithDomain:@"muser"
                                   code:3
                               userInfo:[NSDictionary dictionaryWithObject:@"boom"
                                                                    forKey:NSLocalizedDescriptionKey]];
  __block int calls = 0;
  int (^times_n)(int) = ^(int x) {
    ++calls;
    return x * [t n];
  };
  int ok = [s isEqualToString:@"n=7"] && [[e localizedDescription] isEqualToString:@"boom"] && [e code] == 3 &&
           times_n(6) == 42 && calls == 1;
  [t release];
  [pool release];  // drains the autoreleased thing
  ok = ok && g_deallocs == 2;
  printf("toolchain %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}

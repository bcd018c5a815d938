// The Metal emulator's Objective-C side (test-only; never part of the
// product): classes implementing the protocols of src/metal/metal_api/Metal.h
// on GNUstep, with Metal's ownership rules (new... returns +1, commandBuffer
// and encoders are autoreleased, a command buffer retains what it uses), so
// src/metal/metal_device.mm runs on Linux unchanged. Execution and checks live
// in runtime.cpp behind emu_runtime.h; every failure a check finds becomes a
// command buffer with status Error and an NSError saying what.
#import "metal_api/Metal.h"

#include <stdlib.h>
#include <string.h>

#include <Block.h>

#include "emu_runtime.h"

NSString* const MTLCommandBufferErrorDomain = @"MTLCommandBufferErrorDomain";
NSString* const MTLLibraryErrorDomain = @"MTLLibraryErrorDomain";

static NSError* emu_error(NSString* domain, NSInteger code, NSString* message) {
  return [NSError errorWithDomain:domain
                             code:code
                         userInfo:[NSDictionary dictionaryWithObject:message forKey:NSLocalizedDescriptionKey]];
}

// ---------------- MTLCompileOptions ----------------
// GCC's runtime has the fragile ABI (no instance variables in an
// @implementation), and Metal.h declares the class without any: so
// MTLCompileOptions is a class cluster whose alloc gives this subclass.
@interface MUSEREmuCompileOptions : MTLCompileOptions {
  BOOL _fastMathEnabled;
  MTLMathMode _mathMode;
  BOOL _mathModeSet;
  const char* _unavailable;  // a macOS 15 selector called on an older emulated OS
}
- (const char*)emuUnavailable;
- (BOOL)emuSafeMath;
@end

@implementation MTLCompileOptions
+ (id)allocWithZone:(NSZone*)zone {
  if (self == [MTLCompileOptions class]) return [MUSEREmuCompileOptions allocWithZone:zone];
  return [super allocWithZone:zone];
}
- (id)copyWithZone:(NSZone*)zone {
  [self doesNotRecognizeSelector:_cmd];
  return nil;
}
- (BOOL)fastMathEnabled { return NO; }
- (void)setFastMathEnabled:(BOOL)v {}
- (MTLMathMode)mathMode { return MTLMathModeSafe; }
- (void)setMathMode:(MTLMathMode)m {}
@end

@implementation MUSEREmuCompileOptions
- (instancetype)init {
  if ((self = [super init])) {
    _fastMathEnabled = YES;  // Metal's default
    _mathMode = MTLMathModeRelaxed;
  }
  return self;
}
- (id)copyWithZone:(NSZone*)zone {
  MUSEREmuCompileOptions* c = [[MUSEREmuCompileOptions allocWithZone:zone] init];
  c->_fastMathEnabled = _fastMathEnabled;
  c->_mathMode = _mathMode;
  c->_mathModeSet = _mathModeSet;
  c->_unavailable = _unavailable;
  return c;
}
- (BOOL)fastMathEnabled { return _fastMathEnabled; }
- (void)setFastMathEnabled:(BOOL)v { _fastMathEnabled = v; }
- (MTLMathMode)mathMode {
  if (!muser_metal_emu_os_available("15.0")) _unavailable = "-[MTLCompileOptions mathMode]";
  return _mathMode;
}
- (void)setMathMode:(MTLMathMode)m {
  if (!muser_metal_emu_os_available("15.0")) _unavailable = "-[MTLCompileOptions setMathMode:]";
  _mathMode = m;
  _mathModeSet = YES;
}
- (const char*)emuUnavailable { return _unavailable; }
- (BOOL)emuSafeMath { return _mathModeSet ? _mathMode == MTLMathModeSafe : !_fastMathEnabled; }
@end

// ---------------- resources ----------------
@interface MUSEREmuBuffer : NSObject <MTLBuffer> {
  id<MTLDevice> _device;
  void* _contents;
  NSUInteger _length;
  BOOL _owned;
  BOOL _private;
  void (^_deallocator)(void*, NSUInteger);
  NSString* _label;
}
- (instancetype)initWithDevice:(id<MTLDevice>)d
                      contents:(void*)p
                        length:(NSUInteger)n
                         owned:(BOOL)owned
                       options:(MTLResourceOptions)o
                   deallocator:(void (^)(void*, NSUInteger))dealloc;
@end

@implementation MUSEREmuBuffer
- (instancetype)initWithDevice:(id<MTLDevice>)d
                      contents:(void*)p
                        length:(NSUInteger)n
                         owned:(BOOL)owned
                       options:(MTLResourceOptions)o
                   deallocator:(void (^)(void*, NSUInteger))dealloc {
  if ((self = [super init])) {
    _device = [d retain];
    _contents = p;
    _length = n;
    _owned = owned;
    _private = (o & (0xf << MTLResourceStorageModeShift)) == MTLResourceStorageModePrivate;
    _deallocator = dealloc ? Block_copy(dealloc) : NULL;
  }
  return self;
}
- (void)dealloc {
  if (_deallocator) {
    _deallocator(_contents, _length);
    Block_release(_deallocator);
  }
  if (_owned) free(_contents);
  [_label release];
  [_device release];
  [super dealloc];
}
- (id<MTLDevice>)device { return _device; }
- (NSString*)label { return _label; }
- (void)setLabel:(NSString*)l {
  NSString* c = [l copy];
  [_label release];
  _label = c;
}
- (NSUInteger)length { return _length; }
- (void*)contents { return _private ? NULL : _contents; }  // private storage has no CPU address
- (void*)emuBase { return _contents; }
@end

// ---------------- functions, library, pipelines ----------------
@interface MUSEREmuFunction : NSObject <MTLFunction> {
  id<MTLDevice> _device;
  NSString* _name;
  const void* _kernel;
}
- (instancetype)initWithDevice:(id<MTLDevice>)d name:(NSString*)n kernel:(const void*)k;
- (const void*)emuKernel;
@end

@implementation MUSEREmuFunction
- (instancetype)initWithDevice:(id<MTLDevice>)d name:(NSString*)n kernel:(const void*)k {
  if ((self = [super init])) {
    _device = [d retain];
    _name = [n copy];
    _kernel = k;
  }
  return self;
}
- (void)dealloc {
  [_name release];
  [_device release];
  [super dealloc];
}
- (id<MTLDevice>)device { return _device; }
- (NSString*)name { return _name; }
- (const void*)emuKernel { return _kernel; }
@end

@interface MUSEREmuLibrary : NSObject <MTLLibrary> {
  id<MTLDevice> _device;
  NSArray* _names;  // kernels the source declares (MUSER_KERNEL) and the emulator has
}
- (instancetype)initWithDevice:(id<MTLDevice>)d names:(NSArray*)names;
@end

@implementation MUSEREmuLibrary
- (instancetype)initWithDevice:(id<MTLDevice>)d names:(NSArray*)names {
  if ((self = [super init])) {
    _device = [d retain];
    _names = [names retain];
  }
  return self;
}
- (void)dealloc {
  [_names release];
  [_device release];
  [super dealloc];
}
- (id<MTLDevice>)device { return _device; }
- (id<MTLFunction>)newFunctionWithName:(NSString*)name {
  if (![_names containsObject:name]) return nil;  // Metal: nil for a name the library lacks
  return [[MUSEREmuFunction alloc] initWithDevice:_device name:name kernel:muser_emu_find_kernel([name UTF8String])];
}
@end

@interface MUSEREmuPipeline : NSObject <MTLComputePipelineState> {
  id<MTLDevice> _device;
  const void* _kernel;
}
- (instancetype)initWithDevice:(id<MTLDevice>)d kernel:(const void*)k;
- (const void*)emuKernel;
@end

@implementation MUSEREmuPipeline
- (instancetype)initWithDevice:(id<MTLDevice>)d kernel:(const void*)k {
  if ((self = [super init])) {
    _device = [d retain];
    _kernel = k;
  }
  return self;
}
- (void)dealloc {
  [_device release];
  [super dealloc];
}
- (id<MTLDevice>)device { return _device; }
- (NSUInteger)maxTotalThreadsPerThreadgroup { return 1024; }
- (NSUInteger)threadExecutionWidth { return 32; }
- (NSUInteger)staticThreadgroupMemoryLength { return 0; }  // function-scope arrays are sized when they run
- (const void*)emuKernel { return _kernel; }
@end

// ---------------- encoding ----------------
@class MUSEREmuCommandBuffer;

@interface MUSEREmuComputeEncoder : NSObject <MTLComputeCommandEncoder> {
  id<MTLDevice> _device;
  MTLDispatchType _type;
  muser_emu_encoder* _enc;
  NSMutableArray* _used;  // what the command buffer keeps alive (Metal retains referenced resources)
  BOOL _ended;
  NSString* _label;
}
- (instancetype)initWithDevice:(id<MTLDevice>)d type:(MTLDispatchType)t;
- (BOOL)emuEnded;
- (muser_emu_encoder*)emuEncoder;
@end

@implementation MUSEREmuComputeEncoder
- (instancetype)initWithDevice:(id<MTLDevice>)d type:(MTLDispatchType)t {
  if ((self = [super init])) {
    _device = [d retain];
    _type = t;
    _enc = muser_emu_encoder_new(t == MTLDispatchTypeConcurrent);
    _used = [[NSMutableArray alloc] init];
  }
  return self;
}
- (void)dealloc {
  muser_emu_encoder_free(_enc);
  [_used release];
  [_label release];
  [_device release];
  [super dealloc];
}
- (id<MTLDevice>)device { return _device; }
- (NSString*)label { return _label; }
- (void)setLabel:(NSString*)l {
  NSString* c = [l copy];
  [_label release];
  _label = c;
}
- (MTLDispatchType)dispatchType { return _type; }
- (BOOL)emuEnded { return _ended; }
- (muser_emu_encoder*)emuEncoder { return _enc; }
- (BOOL)emuCheckOpen:(const char*)what {
  if (!_ended) return YES;
  muser_emu_fail("%s after endEncoding (Metal asserts)", what);
  abort();  // real Metal's validation aborts the process here too
}
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state {
  [self emuCheckOpen:"setComputePipelineState:"];
  [_used addObject:state];
  muser_emu_encoder_set_kernel(_enc, [(MUSEREmuPipeline*)state emuKernel], [state maxTotalThreadsPerThreadgroup]);
}
- (void)setBuffer:(id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index {
  [self emuCheckOpen:"setBuffer:offset:atIndex:"];
  if (buffer) [_used addObject:buffer];
  NSString* label = [buffer label];
  char fallback[64];
  snprintf(fallback, sizeof fallback, "buffer %p", (void*)buffer);
  muser_emu_encoder_set_buffer(_enc, index, buffer ? [(MUSEREmuBuffer*)buffer emuBase] : NULL, [buffer length], offset,
                               label ? [label UTF8String] : fallback);
}
- (void)setBytes:(const void*)bytes length:(NSUInteger)length atIndex:(NSUInteger)index {
  [self emuCheckOpen:"setBytes:length:atIndex:"];
  muser_emu_encoder_set_bytes(_enc, index, bytes, length);
}
- (void)setThreadgroupMemoryLength:(NSUInteger)length atIndex:(NSUInteger)index {
  [self emuCheckOpen:"setThreadgroupMemoryLength:atIndex:"];
  muser_emu_encoder_set_threadgroup_length(_enc, index, length);
}
- (void)dispatchThreadgroups:(MTLSize)groups threadsPerThreadgroup:(MTLSize)per {
  [self emuCheckOpen:"dispatchThreadgroups:threadsPerThreadgroup:"];
  size_t c[3] = {groups.width, groups.height, groups.depth}, p[3] = {per.width, per.height, per.depth};
  muser_emu_encoder_dispatch(_enc, c, p, 0);
}
- (void)dispatchThreads:(MTLSize)threads threadsPerThreadgroup:(MTLSize)per {
  [self emuCheckOpen:"dispatchThreads:threadsPerThreadgroup:"];
  size_t c[3] = {threads.width, threads.height, threads.depth}, p[3] = {per.width, per.height, per.depth};
  muser_emu_encoder_dispatch(_enc, c, p, 1);
}
- (void)memoryBarrierWithScope:(MTLBarrierScope)scope {
  [self emuCheckOpen:"memoryBarrierWithScope:"];
  if (scope & MTLBarrierScopeBuffers) muser_emu_encoder_barrier(_enc);  // textures: nothing of ours
}
- (void)endEncoding {
  [self emuCheckOpen:"endEncoding"];
  _ended = YES;
}
@end

@interface MUSEREmuCommandBuffer : NSObject <MTLCommandBuffer> {
  id<MTLDevice> _device;
  id<MTLCommandQueue> _queue;
  NSMutableArray* _encoders;
  MTLCommandBufferStatus _status;
  NSError* _error;
  NSString* _label;
}
- (instancetype)initWithQueue:(id<MTLCommandQueue>)q;
@end

@implementation MUSEREmuCommandBuffer
- (instancetype)initWithQueue:(id<MTLCommandQueue>)q {
  if ((self = [super init])) {
    _queue = [q retain];
    _device = [[q device] retain];
    _encoders = [[NSMutableArray alloc] init];
    _status = MTLCommandBufferStatusNotEnqueued;
  }
  return self;
}
- (void)dealloc {
  [_encoders release];
  [_error release];
  [_label release];
  [_queue release];
  [_device release];
  [super dealloc];
}
- (id<MTLDevice>)device { return _device; }
- (id<MTLCommandQueue>)commandQueue { return _queue; }
- (NSString*)label { return _label; }
- (void)setLabel:(NSString*)l {
  NSString* c = [l copy];
  [_label release];
  _label = c;
}
- (MTLCommandBufferStatus)status { return _status; }
- (NSError*)error { return _error; }
- (void)emuFailWith:(NSInteger)code message:(NSString*)m {
  muser_emu_fail("command buffer failed: %s", [m UTF8String]);
  _status = MTLCommandBufferStatusError;
  [_error release];
  _error = [emu_error(MTLCommandBufferErrorDomain, code,
                      [NSString stringWithFormat:@"muser Metal emulator: %@", m]) retain];
}
- (id<MTLComputeCommandEncoder>)computeCommandEncoder {
  return [self computeCommandEncoderWithDispatchType:MTLDispatchTypeSerial];
}
- (id<MTLComputeCommandEncoder>)computeCommandEncoderWithDispatchType:(MTLDispatchType)type {
  if (_status != MTLCommandBufferStatusNotEnqueued || ([_encoders count] && ![[_encoders lastObject] emuEnded])) {
    muser_emu_fail("a compute encoder was asked for %s (Metal asserts)",
                   _status != MTLCommandBufferStatusNotEnqueued ? "after commit" : "before the last one ended");
    abort();
  }
  MUSEREmuComputeEncoder* e = [[MUSEREmuComputeEncoder alloc] initWithDevice:_device type:type];
  [_encoders addObject:e];
  return [e autorelease];
}
- (void)commit {
  if (_status != MTLCommandBufferStatusNotEnqueued) {
    muser_emu_fail("commit of a command buffer already committed (Metal asserts)");
    abort();
  }
  if ([_encoders count] && ![[_encoders lastObject] emuEnded]) {
    muser_emu_fail("commit with an encoder that has not called endEncoding (Metal asserts)");
    abort();
  }
  _status = MTLCommandBufferStatusCommitted;
  char msg[4096];
  if (muser_emu_take_injected_failure(msg, sizeof msg)) {
    [self emuFailWith:MTLCommandBufferErrorInternal message:[NSString stringWithUTF8String:msg]];
    return;
  }
  // Run at commit (the GPU would start now); waitUntilCompleted then has nothing to wait for.
  NSUInteger i, n = [_encoders count];
  for (i = 0; i < n; ++i) {
    int code = muser_emu_encoder_run([[_encoders objectAtIndex:i] emuEncoder], msg, sizeof msg);
    if (code) {
      [self emuFailWith:code message:[NSString stringWithUTF8String:msg]];
      return;
    }
  }
  _status = MTLCommandBufferStatusCompleted;
}
- (void)waitUntilCompleted {
  if (_status == MTLCommandBufferStatusNotEnqueued) {
    // real Metal blocks forever here; a test would hang
    [self emuFailWith:MTLCommandBufferErrorInternal message:@"waitUntilCompleted before commit blocks forever on Metal"];
  }
}
@end

@interface MUSEREmuCommandQueue : NSObject <MTLCommandQueue> {
  id<MTLDevice> _device;
  NSString* _label;
}
- (instancetype)initWithDevice:(id<MTLDevice>)d;
@end

@implementation MUSEREmuCommandQueue
- (instancetype)initWithDevice:(id<MTLDevice>)d {
  if ((self = [super init])) _device = [d retain];
  return self;
}
- (void)dealloc {
  [_label release];
  [_device release];
  [super dealloc];
}
- (id<MTLDevice>)device { return _device; }
- (NSString*)label { return _label; }
- (void)setLabel:(NSString*)l {
  NSString* c = [l copy];
  [_label release];
  _label = c;
}
- (id<MTLCommandBuffer>)commandBuffer {
  return [[[MUSEREmuCommandBuffer alloc] initWithQueue:self] autorelease];
}
@end

// ---------------- the device ----------------
@interface MUSEREmuDevice : NSObject <MTLDevice>
@end

// The kernel names a source declares: MUSER_KERNEL(name, ...) outside
// comments and #define lines (kernel_abi.h itself may be in the source).
static NSArray* emu_kernel_names(const char* src) {
  size_t n = strlen(src);
  char* s = (char*)malloc(n + 1);
  size_t i = 0, o = 0;
  while (i < n) {  // strip comments, keeping newlines
    if (src[i] == '/' && src[i + 1] == '/') {
      while (i < n && src[i] != '\n') ++i;
    } else if (src[i] == '/' && src[i + 1] == '*') {
      i += 2;
      while (i < n && !(src[i] == '*' && src[i + 1] == '/')) {
        if (src[i] == '\n') s[o++] = '\n';
        ++i;
      }
      i += 2;
    } else {
      s[o++] = src[i++];
    }
  }
  s[o] = 0;
  NSMutableArray* names = [NSMutableArray array];
  const char* key = "MUSER_KERNEL(";
  for (const char* p = strstr(s, key); p; p = strstr(p + 1, key)) {
    const char* line = p;
    while (line > s && line[-1] != '\n') --line;
    while (*line == ' ' || *line == '\t') ++line;
    if (*line == '#') continue;  // the macro's own definition
    const char* q = p + strlen(key);
    while (*q == ' ' || *q == '\t' || *q == '\n') ++q;
    const char* e = q;
    while ((*e >= 'a' && *e <= 'z') || (*e >= 'A' && *e <= 'Z') || (*e >= '0' && *e <= '9') || *e == '_') ++e;
    if (e > q) [names addObject:[[[NSString alloc] initWithBytes:q length:(NSUInteger)(e - q)
                                                         encoding:NSUTF8StringEncoding] autorelease]];
  }
  free(s);
  return names;
}

@implementation MUSEREmuDevice
- (NSString*)name { return @"muser Metal emulator (test-only)"; }
- (MTLSize)maxThreadsPerThreadgroup { return MTLSizeMake(1024, 1024, 1024); }
- (NSUInteger)maxBufferLength { return muser_emu_max_buffer_length(); }
- (NSUInteger)maxThreadgroupMemoryLength { return 32768; }
- (BOOL)hasUnifiedMemory { return YES; }
- (uint64_t)recommendedMaxWorkingSetSize { return (uint64_t)16 << 30; }
- (id<MTLCommandQueue>)newCommandQueue { return [[MUSEREmuCommandQueue alloc] initWithDevice:self]; }
- (id<MTLBuffer>)newBufferWithLength:(NSUInteger)length options:(MTLResourceOptions)options {
  if (length == 0 || length > muser_emu_max_buffer_length()) {
    muser_emu_fail("newBufferWithLength:%lu: %s maxBufferLength %lu; Metal returns nil", (unsigned long)length,
                   length ? "over" : "zero bytes; the device's", (unsigned long)muser_emu_max_buffer_length());
    return nil;
  }
  void* p = NULL;
  size_t page = muser_emu_page_size();
  if (posix_memalign(&p, page, (length + page - 1) / page * page)) return nil;
  memset(p, 0, length);
  return [[MUSEREmuBuffer alloc] initWithDevice:self contents:p length:length owned:YES options:options deallocator:NULL];
}
- (id<MTLBuffer>)newBufferWithBytesNoCopy:(void*)pointer
                                   length:(NSUInteger)length
                                  options:(MTLResourceOptions)options
                              deallocator:(void (^)(void*, NSUInteger))deallocator {
  size_t page = muser_emu_page_size();
  if ((uintptr_t)pointer % page || length % page || length == 0) {
    muser_emu_fail("newBufferWithBytesNoCopy:%p length:%lu: the pointer and the length must be multiples of the "
                   "%zu-byte page; Metal returns nil",
                   pointer, (unsigned long)length, page);
    return nil;
  }
  if (length > muser_emu_max_buffer_length()) {
    muser_emu_fail("newBufferWithBytesNoCopy: length %lu over maxBufferLength %lu; Metal returns nil",
                   (unsigned long)length, (unsigned long)muser_emu_max_buffer_length());
    return nil;
  }
  return [[MUSEREmuBuffer alloc] initWithDevice:self
                                       contents:pointer
                                         length:length
                                          owned:NO
                                        options:options
                                    deallocator:deallocator];
}
- (id<MTLLibrary>)newLibraryWithSource:(NSString*)source options:(MTLCompileOptions*)options error:(NSError**)error {
  NSString* problem = nil;
  NSArray* names = emu_kernel_names([source UTF8String]);
  NSMutableArray* missing = [NSMutableArray array];
  NSUInteger i;
  for (i = 0; i < [names count]; ++i)
    if (!muser_emu_find_kernel([[names objectAtIndex:i] UTF8String])) [missing addObject:[names objectAtIndex:i]];
  MUSEREmuCompileOptions* opts = (MUSEREmuCompileOptions*)options;
  if (opts && [opts emuUnavailable]) {
    problem = [NSString stringWithFormat:@"%s is macOS 15+; the emulated OS is older (unrecognized selector)",
                                         [opts emuUnavailable]];
  } else if (!muser_emu_allow_fast_math() && !(opts && [opts emuSafeMath])) {
    problem = @"the library would be compiled with fast math, which changes the kernels' rounding on Metal: set "
              @"mathMode = MTLMathModeSafe (macOS 15+) or fastMathEnabled = NO";
  } else if ([names count] == 0) {
    problem = @"program_source: error: no kernel in the source (the emulator finds kernels by MUSER_KERNEL(name, ...))";
  } else if ([missing count]) {
    problem = [NSString stringWithFormat:@"program_source: error: no emulator build of kernel(s) %@ (their .metal "
                                         @"file is not compiled into the emulator)",
                                         [missing componentsJoinedByString:@", "]];
  }
  if (problem) {
    muser_emu_fail("newLibraryWithSource: %s", [problem UTF8String]);
    if (error) *error = emu_error(MTLLibraryErrorDomain, MTLLibraryErrorCompileFailure,
                                  [NSString stringWithFormat:@"Compilation failed: \n\n%@", problem]);
    return nil;
  }
  return [[MUSEREmuLibrary alloc] initWithDevice:self names:names];
}
- (id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)function error:(NSError**)error {
  if (!function) {
    if (error) *error = emu_error(MTLLibraryErrorDomain, MTLLibraryErrorFunctionNotFound, @"no function given");
    return nil;
  }
  return [[MUSEREmuPipeline alloc] initWithDevice:self kernel:[(MUSEREmuFunction*)function emuKernel]];
}
@end

id<MTLDevice> MTLCreateSystemDefaultDevice(void) {
  muser_emu_load_environment();
  if (muser_emu_no_device()) return nil;
  return [[MUSEREmuDevice alloc] init];
}

// The project's own declarations of the Foundation subset that
// src/metal/metal_device.mm and src/metal/metal_api/Metal.h use, with Apple's
// names and types, for the aarch64-macos cross-compile check
// (tests/apple_cross/check.sh): zig's clang ships macOS's libc headers but no
// frameworks. Compile only -- nothing here is ever linked or run; on a Mac the
// real Foundation.framework is used, and the Linux emulator uses GNUstep's.
// Written from Apple's documentation (NSObjCRuntime.h, NSObject.h, NSString.h,
// NSError.h are the authority); on arm64 Apple's BOOL is C's bool and
// NSInteger/NSUInteger are long/unsigned long.
#pragma once

#if !defined(__APPLE__) || !defined(__OBJC__)
#error "tests/apple_cross/include/Foundation is for the Objective-C aarch64-macos cross-compile only"
#endif

#include <stddef.h>
#include <stdint.h>

// ---- NSObjCRuntime.h ----
typedef long NSInteger;
typedef unsigned long NSUInteger;
typedef bool BOOL;
#define YES __objc_yes
#define NO __objc_no
#ifndef nil
#define nil nullptr
#endif

#define NS_RETURNS_RETAINED __attribute__((ns_returns_retained))
#define NS_ROOT_CLASS __attribute__((objc_root_class))
#define NS_RETURNS_INNER_POINTER __attribute__((objc_returns_inner_pointer))

// C++ spellings of Apple's CF_ENUM / CF_OPTIONS: a fixed underlying type; the
// options are the integer type itself, so `a | b` stays that type
#define NS_ENUM(_type, _name) enum _name : _type _name; enum _name : _type
#define NS_OPTIONS(_type, _name) _type _name; enum : _type

NSUInteger NSPageSize(void);

// ---- NSObject.h ----
@class NSString;

@protocol NSObject
- (instancetype)retain;
- (oneway void)release;
- (instancetype)autorelease;
- (NSUInteger)retainCount;
- (BOOL)isEqual:(id)object;
- (NSString*)description;
@end

NS_ROOT_CLASS
@interface NSObject <NSObject>
+ (instancetype)alloc;
+ (instancetype) new;
- (instancetype)init;
- (void)dealloc;
@end

@protocol NSCopying
- (id)copyWithZone:(void*)zone;
@end

// ---- NSString.h, NSError.h ----
@interface NSString : NSObject <NSCopying>
+ (instancetype)stringWithUTF8String:(const char*)nullTerminatedCString;  // autoreleased
@property(readonly) NSUInteger length;
@property(readonly) const char* UTF8String NS_RETURNS_INNER_POINTER;
@end

typedef NSString* NSErrorDomain;

@interface NSError : NSObject <NSCopying>
@property(readonly, copy) NSErrorDomain domain;
@property(readonly) NSInteger code;
@property(readonly, copy) NSString* localizedDescription;
@end

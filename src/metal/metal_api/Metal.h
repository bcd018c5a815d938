// The project's own declarations of exactly the Metal subset muser uses, with
// Apple's names, signatures and enum values (Metal.framework's headers are the
// authority; these are written from its documentation, not copied). One set
// serves both builds that have no Apple SDK:
//   - Linux, MUSER_METAL_EMULATOR=ON: implemented by the test-only emulator
//     (tests/metal_emulator/) on GNUstep's Foundation;
//   - the aarch64-macos cross-compile (zig's clang): linked against the real
//     Metal.framework, whose Objective-C messages, C functions and constants
//     these declarations name, so values and layouts must stay Apple's.
// Adding a Metal call to src/metal/metal_device.mm means declaring it here
// (with Apple's signature) and implementing it in the emulator.
//
// Memory management is manual (ARC off): `new...` and MTLCreateSystemDefaultDevice
// return objects the caller owns; commandBuffer, computeCommandEncoder... and
// error out-parameters are autoreleased.
#pragma once

#import <Foundation/Foundation.h>

#if defined(__cplusplus)
#define MUSER_MTL_EXTERN extern "C"
#else
#define MUSER_MTL_EXTERN extern
#endif

// Apple's availability of the two version-dependent members, so the macOS
// cross-compile's -Werror=unguarded-availability sees what the SDK would.
// Empty on Linux: the emulator build is unchanged (it asks its own OS answer).
#if defined(__APPLE__)
#define MUSER_MTL_API_MACOS(v) __attribute__((availability(macos, introduced = v)))
#define MUSER_MTL_DEPRECATED_MACOS(from, to) __attribute__((availability(macos, introduced = from, deprecated = to)))
#else
#define MUSER_MTL_API_MACOS(v)
#define MUSER_MTL_DEPRECATED_MACOS(from, to)
#endif

// ---- value types ----
typedef struct {
  NSUInteger width;
  NSUInteger height;
  NSUInteger depth;
} MTLSize;

static inline MTLSize MTLSizeMake(NSUInteger width, NSUInteger height, NSUInteger depth) {
  MTLSize s;
  s.width = width;
  s.height = height;
  s.depth = depth;
  return s;
}

// ---- enums and options (Apple's values) ----
#define MTLResourceCPUCacheModeShift 0
#define MTLResourceStorageModeShift 4
#define MTLResourceHazardTrackingModeShift 8
typedef NS_OPTIONS(NSUInteger, MTLResourceOptions){
    MTLResourceCPUCacheModeDefaultCache = 0 << MTLResourceCPUCacheModeShift,
    MTLResourceCPUCacheModeWriteCombined = 1 << MTLResourceCPUCacheModeShift,
    MTLResourceStorageModeShared = 0 << MTLResourceStorageModeShift,
    MTLResourceStorageModeManaged = 1 << MTLResourceStorageModeShift,
    MTLResourceStorageModePrivate = 2 << MTLResourceStorageModeShift,
    MTLResourceStorageModeMemoryless = 3 << MTLResourceStorageModeShift,
    MTLResourceHazardTrackingModeDefault = 0 << MTLResourceHazardTrackingModeShift,
    MTLResourceHazardTrackingModeUntracked = 1 << MTLResourceHazardTrackingModeShift,
    MTLResourceHazardTrackingModeTracked = 2 << MTLResourceHazardTrackingModeShift,
};

typedef NS_ENUM(NSUInteger, MTLCommandBufferStatus){
    MTLCommandBufferStatusNotEnqueued = 0, MTLCommandBufferStatusEnqueued = 1,
    MTLCommandBufferStatusCommitted = 2,   MTLCommandBufferStatusScheduled = 3,
    MTLCommandBufferStatusCompleted = 4,   MTLCommandBufferStatusError = 5,
};

typedef NS_ENUM(NSUInteger, MTLCommandBufferError){
    MTLCommandBufferErrorNone = 0,         MTLCommandBufferErrorInternal = 1,
    MTLCommandBufferErrorTimeout = 2,      MTLCommandBufferErrorPageFault = 3,
    MTLCommandBufferErrorAccessRevoked = 4, MTLCommandBufferErrorNotPermitted = 7,
    MTLCommandBufferErrorOutOfMemory = 8,  MTLCommandBufferErrorInvalidResource = 9,
    MTLCommandBufferErrorMemoryless = 10,  MTLCommandBufferErrorDeviceRemoved = 11,
    MTLCommandBufferErrorStackOverflow = 12,
};

typedef NS_ENUM(NSUInteger, MTLLibraryError){
    MTLLibraryErrorUnsupported = 1,     MTLLibraryErrorInternal = 2,
    MTLLibraryErrorCompileFailure = 3,  MTLLibraryErrorCompileWarning = 4,
    MTLLibraryErrorFunctionNotFound = 5, MTLLibraryErrorFileNotFound = 6,
};

typedef NS_ENUM(NSUInteger, MTLDispatchType){
    MTLDispatchTypeSerial = 0,
    MTLDispatchTypeConcurrent = 1,
};

typedef NS_OPTIONS(NSUInteger, MTLBarrierScope){
    MTLBarrierScopeBuffers = 1 << 0,
    MTLBarrierScopeTextures = 1 << 1,
    MTLBarrierScopeRenderTargets = 1 << 2,
};

// macOS 15+: MTLCompileOptions.mathMode (before: fastMathEnabled only).
// Call it only under MUSER_MACOS_AVAILABLE(15.0) (muser_os_version.h).
typedef NS_ENUM(NSInteger, MTLMathMode){
    MTLMathModeSafe = 0,
    MTLMathModeRelaxed = 1,
    MTLMathModeFast = 2,
};

MUSER_MTL_EXTERN NSString* const MTLCommandBufferErrorDomain;
MUSER_MTL_EXTERN NSString* const MTLLibraryErrorDomain;

@protocol MTLDevice;
@protocol MTLCommandQueue;
@protocol MTLCommandBuffer;
@protocol MTLComputeCommandEncoder;
@protocol MTLBuffer;
@protocol MTLLibrary;
@protocol MTLFunction;
@protocol MTLComputePipelineState;

// ---- compile options: a class, not a protocol ----
@interface MTLCompileOptions : NSObject <NSCopying>
@property(readwrite, nonatomic) BOOL fastMathEnabled MUSER_MTL_DEPRECATED_MACOS(10.11, 15.0);  // default YES
@property(readwrite, nonatomic) MTLMathMode mathMode MUSER_MTL_API_MACOS(15.0);            // default Fast
@end

// ---- resources ----
@protocol MTLResource <NSObject>
@property(readonly) id<MTLDevice> device;
@property(copy, atomic) NSString* label;
@end

@protocol MTLBuffer <MTLResource>
@property(readonly) NSUInteger length;
- (void*)contents;
@end

// ---- library, functions, pipelines ----
@protocol MTLFunction <NSObject>
@property(readonly) id<MTLDevice> device;
@property(readonly) NSString* name;
@end

@protocol MTLLibrary <NSObject>
@property(readonly) id<MTLDevice> device;
- (id<MTLFunction>)newFunctionWithName:(NSString*)functionName;
@end

@protocol MTLComputePipelineState <NSObject>
@property(readonly) id<MTLDevice> device;
@property(readonly) NSUInteger maxTotalThreadsPerThreadgroup;
@property(readonly) NSUInteger threadExecutionWidth;
@property(readonly) NSUInteger staticThreadgroupMemoryLength;
@end

// ---- encoding ----
@protocol MTLCommandEncoder <NSObject>
@property(readonly) id<MTLDevice> device;
@property(copy, atomic) NSString* label;
- (void)endEncoding;
@end

@protocol MTLComputeCommandEncoder <MTLCommandEncoder>
@property(readonly) MTLDispatchType dispatchType;
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state;
- (void)setBuffer:(id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index;
- (void)setBytes:(const void*)bytes length:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)setThreadgroupMemoryLength:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)dispatchThreadgroups:(MTLSize)threadgroupsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
- (void)dispatchThreads:(MTLSize)threadsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
- (void)memoryBarrierWithScope:(MTLBarrierScope)scope;
@end

@protocol MTLCommandBuffer <NSObject>
@property(readonly) id<MTLDevice> device;
@property(readonly) id<MTLCommandQueue> commandQueue;
@property(copy, atomic) NSString* label;
@property(readonly) MTLCommandBufferStatus status;
@property(readonly) NSError* error;
- (id<MTLComputeCommandEncoder>)computeCommandEncoder;
- (id<MTLComputeCommandEncoder>)computeCommandEncoderWithDispatchType:(MTLDispatchType)dispatchType;
- (void)commit;
- (void)waitUntilCompleted;
@end

@protocol MTLCommandQueue <NSObject>
@property(readonly) id<MTLDevice> device;
@property(copy, atomic) NSString* label;
- (id<MTLCommandBuffer>)commandBuffer;
@end

@protocol MTLDevice <NSObject>
@property(readonly) NSString* name;
@property(readonly) MTLSize maxThreadsPerThreadgroup;
@property(readonly) NSUInteger maxBufferLength;
@property(readonly) NSUInteger maxThreadgroupMemoryLength;
@property(readonly) BOOL hasUnifiedMemory;
@property(readonly) uint64_t recommendedMaxWorkingSetSize;
- (id<MTLCommandQueue>)newCommandQueue;
- (id<MTLBuffer>)newBufferWithLength:(NSUInteger)length options:(MTLResourceOptions)options;
- (id<MTLBuffer>)newBufferWithBytesNoCopy:(void*)pointer
                                   length:(NSUInteger)length
                                  options:(MTLResourceOptions)options
                              deallocator:(void (^)(void* pointer, NSUInteger length))deallocator;
- (id<MTLLibrary>)newLibraryWithSource:(NSString*)source
                               options:(MTLCompileOptions*)options
                                 error:(NSError**)error;
- (id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)computeFunction
                                                             error:(NSError**)error;
@end

// Returns a device the caller owns (release it), or nil when there is none.
MUSER_MTL_EXTERN id<MTLDevice> MTLCreateSystemDefaultDevice(void) NS_RETURNS_RETAINED;

// The binary interface between kernels compiled as C++ (kernel_abi.h,
// MUSER_METAL_EMULATOR) and the emulator's scheduler (runtime.cpp). Builtin
// types only: kernel translation units are compiled with no host headers.
// Test-only: part of the Metal emulator, never of the product.
#pragma once

#if defined(__cplusplus)
extern "C" {
#endif

#define MUSER_EMU_MAX_BINDINGS 31  // Metal's [[buffer(n)]] / [[threadgroup(n)]] index range

// What one GPU thread's kernel call is given (scalar attributes are .x).
typedef struct muser_emu_thread {
  void* buffers[MUSER_EMU_MAX_BINDINGS];      // contents + offset, or the setBytes copy
  void* tg_memory[MUSER_EMU_MAX_BINDINGS];    // this threadgroup's [[threadgroup(n)]] memory
  unsigned int thread_position_in_grid;
  unsigned int threadgroup_position_in_grid;
  unsigned int thread_position_in_threadgroup;
  unsigned int threads_per_threadgroup;
  unsigned int threadgroups_per_grid;
  unsigned int thread_index_in_simdgroup;
  unsigned int simdgroup_index_in_threadgroup;
} muser_emu_thread;

// Binding kinds, from the MUSER_ARG_* descriptors.
enum {
  MUSER_EMU_ARG_BUF_IN = 1,  // device const T*   [[buffer(i)]]: read
  MUSER_EMU_ARG_BUF_OUT,     // device T*         [[buffer(i)]]: written (may be read)
  MUSER_EMU_ARG_BUF_INOUT,   // device T*         [[buffer(i)]]: read and written
  MUSER_EMU_ARG_CONST,       // constant T&       [[buffer(i)]]: read, sizeof(T) bytes
  MUSER_EMU_ARG_TG,          // threadgroup T*    [[threadgroup(i)]]
  MUSER_EMU_ARG_TID,
  MUSER_EMU_ARG_TGID,
  MUSER_EMU_ARG_TPTG,
  MUSER_EMU_ARG_NTPTG,
  MUSER_EMU_ARG_NTGPG,
  MUSER_EMU_ARG_LANE,
  MUSER_EMU_ARG_SGID,
};

typedef struct muser_emu_binding {
  int kind;            // MUSER_EMU_ARG_*
  int index;           // n of [[buffer(n)]] / [[threadgroup(n)]]; 0 for attributes
  unsigned long size;  // sizeof the pointee (a CONST reads exactly this many bytes)
  const char* name;    // the parameter's name, for messages
} muser_emu_binding;

typedef void (*muser_emu_kernel_fn)(const muser_emu_thread* t);

// Called by each kernel's static initializer (MUSER_KERNEL); returns 0.
int muser_emu_register_kernel(const char* name, muser_emu_kernel_fn fn, const muser_emu_binding* bindings,
                              unsigned long count);

// The per-threadgroup storage of a function-scope threadgroup array (one per
// declaration site, the same pointer for every thread of a threadgroup).
void* muser_emu_threadgroup_array(const void* site, unsigned long bytes, unsigned long align, const char* name);

// A SIMD-group operation: a rendezvous of the active lanes of the caller's
// SIMD-group. `value` is the lane's 32 bits; `arg` the mask/delta/lane.
enum {
  MUSER_EMU_SIMD_XOR = 1,
  MUSER_EMU_SIMD_DOWN,
  MUSER_EMU_SIMD_UP,
  MUSER_EMU_SIMD_SHUFFLE,
  MUSER_EMU_SIMD_SUM_F32,
  MUSER_EMU_SIMD_SUM_I32,
  MUSER_EMU_SIMD_MAX_F32,
  MUSER_EMU_SIMD_MIN_F32,
};
unsigned int muser_emu_simd(int op, unsigned int value, unsigned int arg);

#if defined(__cplusplus)
}
#endif

// The emulator's C interface between its Objective-C classes (metal_emulator.m)
// and its C++ scheduler (runtime.cpp). Test-only.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "muser_metal_emulator.h"

#if defined(__cplusplus)
extern "C" {
#endif

typedef struct muser_emu_encoder muser_emu_encoder;

// kernels registered by the .metal files compiled as C++; NULL when absent
const void* muser_emu_find_kernel(const char* name);

// settings (muser_metal_emulator.h) as the device reads them
void muser_emu_load_environment(void);  // once, at the first device
uint64_t muser_emu_seed(void);
size_t muser_emu_page_size(void);
size_t muser_emu_max_buffer_length(void);
int muser_emu_no_device(void);
int muser_emu_allow_fast_math(void);
int muser_emu_take_injected_failure(char* msg, size_t cap);  // 1 and the message when one was set
void muser_emu_fail(const char* fmt, ...);                    // logs and keeps as the last error

muser_emu_encoder* muser_emu_encoder_new(int concurrent);
void muser_emu_encoder_free(muser_emu_encoder* e);
void muser_emu_encoder_set_kernel(muser_emu_encoder* e, const void* kernel, size_t max_threads);
void muser_emu_encoder_set_buffer(muser_emu_encoder* e, size_t index, void* contents, size_t length, size_t offset,
                                  const char* label);
void muser_emu_encoder_set_bytes(muser_emu_encoder* e, size_t index, const void* bytes, size_t length);
void muser_emu_encoder_set_threadgroup_length(muser_emu_encoder* e, size_t index, size_t length);
// threads_mode 0: dispatchThreadgroups (count = threadgroups); 1: dispatchThreads (count = threads)
void muser_emu_encoder_dispatch(muser_emu_encoder* e, const size_t count[3], const size_t per_group[3],
                                int threads_mode);
void muser_emu_encoder_barrier(muser_emu_encoder* e);
// Runs what was encoded; 0 when it ran clean, else an MTLCommandBufferError
// code with the message in msg.
int muser_emu_encoder_run(muser_emu_encoder* e, char* msg, size_t cap);

#if defined(__cplusplus)
}
#endif

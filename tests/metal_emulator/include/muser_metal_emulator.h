// Test hooks of the test-only Metal emulator (never part of the product): what
// a test may set or read that real Metal decides by itself. Each setting also
// has an environment variable, read when the first device is created:
//   MUSER_METAL_EMU_SEED               order of dispatches between barriers (default 1)
//   MUSER_METAL_EMU_PAGE_SIZE          alignment newBufferWithBytesNoCopy demands (16384)
//   MUSER_METAL_EMU_MAX_BUFFER_LENGTH  the device's maxBufferLength (8 GiB)
//   MUSER_METAL_EMU_MACOS              the OS MUSER_MACOS_AVAILABLE answers for ("15.0")
//   MUSER_METAL_EMU_NO_DEVICE=1        MTLCreateSystemDefaultDevice returns nil
//   MUSER_METAL_EMU_ALLOW_FAST_MATH=1  accept libraries compiled with fast math
#pragma once

#include <stddef.h>
#include <stdint.h>

#if defined(__cplusplus)
extern "C" {
#endif

void muser_metal_emu_reset(void);  // every setting back to its default (environment ignored)
void muser_metal_emu_set_seed(uint64_t seed);
void muser_metal_emu_set_page_size(size_t bytes);
void muser_metal_emu_set_max_buffer_length(size_t bytes);
void muser_metal_emu_set_os_version(int major, int minor);
int muser_metal_emu_os_available(const char* version);  // what MUSER_MACOS_AVAILABLE(v) calls
void muser_metal_emu_set_no_device(int no_device);
void muser_metal_emu_set_allow_fast_math(int allow);
// The next committed command buffer fails (status Error) with this message.
void muser_metal_emu_fail_next_command_buffer(const char* message);
// The last failure the emulator logged (also on stderr), "" when none.
const char* muser_metal_emu_last_error(void);
// The order the last concurrent interval ran its dispatches (encode indices).
size_t muser_metal_emu_last_order(size_t* out, size_t cap);

#if defined(__cplusplus)
}
#endif

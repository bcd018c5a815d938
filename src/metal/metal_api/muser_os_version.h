// The one OS-version check of the Metal backend. On macOS it is @available;
// on Linux @available is always true, so the emulator answers instead and a
// test can set the OS it claims (muser_metal_emu_set_os_version), which keeps
// the pre-macOS-15 path (fastMathEnabled = NO instead of mathMode) tested.
// Use: if (MUSER_MACOS_AVAILABLE(15.0)) { ... } — one pp-number, major.minor.
#pragma once

#if defined(MUSER_METAL_EMULATOR)
#if defined(__cplusplus)
extern "C"
#endif
    int
    muser_metal_emu_os_available(const char* version);  // "15.0": nonzero when the emulated OS is at least that
#define MUSER_MACOS_AVAILABLE(version) muser_metal_emu_os_available(#version)
#else
#define MUSER_MACOS_AVAILABLE(version) @available(macOS version, *)  // bare: clang wants `if (@available(...))`
#endif

// Forced-include for the syntax check of src/metal/kernels/*.metal against
// the Metal shim (tests/metal_device/check_kernels.sh): the one MSL spelling
// the host compiler cannot parse, a template instantiation's host_name.
#pragma once
#define MUSER_KERNEL_INSTANCE(name, type, ...) template type __VA_ARGS__;

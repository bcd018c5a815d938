// Forced-include for the syntax check of src/metal/kernels/*.metal against
// the Metal shim (tests/metal_device/check_kernels.sh): MSL's kernel and
// argument attributes, which a host compiler cannot parse, dropped.
#pragma once

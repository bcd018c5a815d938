// Temporary: the CUDA device is being written (issue 5); until it lands a
// CUDA build reports the backend as unavailable rather than failing to link.
#include <memory>

#include "device.h"
#include "errors.h"

namespace muser {
std::unique_ptr<Device> make_cuda_device(int, int) {
  throw DeviceError("device 'cuda': the CUDA device is not implemented in this build yet");
}
}  // namespace muser

// Linked when muser is built without the CUDA backend (no nvcc): asking for a
// CUDA device says which build is missing instead of failing obscurely.
#include "device.h"
#include "errors.h"

namespace muser {

std::unique_ptr<Device> make_cuda_device(int ordinal) {
  throw DeviceError("device 'cuda:" + std::to_string(ordinal) +
                    "': this build of muser has no CUDA backend (it was built without nvcc; "
                    "rebuild where nvcc is found, or with -DMUSER_BUILD_CUDA=ON)");
}

}  // namespace muser

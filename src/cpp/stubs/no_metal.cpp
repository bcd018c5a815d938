// Linked when muser is built without the Metal backend (every build off
// Apple): asking for the Metal device says so.
#include "device.h"
#include "errors.h"

namespace muser {

std::unique_ptr<Device> make_metal_device() {
  throw DeviceError("device 'metal': this build of muser has no Metal backend (Metal is built on Apple only)");
}

}  // namespace muser

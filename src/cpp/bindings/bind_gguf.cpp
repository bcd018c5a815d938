// placeholder: replaced by the gguf work
#include "bindings.h"
namespace muser::py {
void bind_gguf(nanobind::module_&) {}
}  // namespace muser::py

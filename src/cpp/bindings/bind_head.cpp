// placeholder: replaced by the head work
#include "bindings.h"
namespace muser::py {
void bind_head(nanobind::module_&) {}
}  // namespace muser::py

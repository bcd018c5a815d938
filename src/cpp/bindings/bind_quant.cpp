// placeholder: replaced by the quant work
#include "bindings.h"
namespace muser::py {
void bind_quant(nanobind::module_&) {}
}  // namespace muser::py

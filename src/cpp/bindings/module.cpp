// muser._core: the nanobind extension. Python-facing names are re-exported by
// python/muser/__init__.py; nothing here is public on its own.
#include <nanobind/nanobind.h>

#include "bindings.h"
#include "errors.h"

namespace nb = nanobind;

namespace muser::py {

void bind_errors(nb::module_& m) {
  // Error derives from Exception; the others from Error. Argument mistakes
  // surface as the built-in TypeError / ValueError.
  static nb::exception<muser::Error> error(m, "Error", PyExc_Exception);
  static nb::exception<muser::GGUFError> gguf_error(m, "GGUFError", error.ptr());
  static nb::exception<muser::SpecError> spec_error(m, "SpecError", error.ptr());
  static nb::exception<muser::DeviceError> device_error(m, "DeviceError", error.ptr());
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const muser::ArgTypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const muser::ArgValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const muser::GGUFNotFound& e) {
      // muser.GGUFFileNotFoundError derives from GGUFError and FileNotFoundError
      nb::object cls = nb::module_::import_("muser.errors").attr("GGUFFileNotFoundError");
      PyErr_SetString(cls.ptr(), e.what());
    } catch (const muser::NonFiniteError& e) {
      // muser.NonFiniteError is a Python class deriving from Error and ValueError
      nb::object cls = nb::module_::import_("muser.errors").attr("NonFiniteError");
      PyErr_SetString(cls.ptr(), e.what());
    }
  });
}

}  // namespace muser::py

NB_MODULE(_core, m) {
  m.doc() = "muser's C++ engine (private; use the muser package)";
  muser::py::bind_errors(m);
  muser::py::bind_build_info(m);
  muser::py::bind_gguf(m);
  muser::py::bind_quant(m);
  muser::py::bind_head(m);
  muser::py::bind_cpu(m);
  muser::py::bind_device(m);
  muser::py::bind_cuda(m);
  muser::py::bind_metal(m);
  muser::py::bind_sample(m);
  muser::py::bind_shard(m);
}

// muser._core._quantize / _dequantize: numpy <-> GGUF block bytes.
// python/muser/_quant.py wraps them with the public names, docstrings and
// type-name normalization. Arguments are validated here, at the boundary,
// with messages that say what was expected and what was got; the loops run
// with the GIL released and the result array is built after it is retaken.
#include <memory>
#include <string>
#include <vector>

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "arrays.h"
#include "bindings.h"
#include "errors.h"
#include "quantize.h"

namespace nb = nanobind;

namespace muser::py {
namespace {

std::string dtype_name(nb::dlpack::dtype dt) {
  std::string kind;
  switch ((nb::dlpack::dtype_code)dt.code) {
    case nb::dlpack::dtype_code::Int: kind = "int"; break;
    case nb::dlpack::dtype_code::UInt: kind = "uint"; break;
    case nb::dlpack::dtype_code::Float: kind = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: kind = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: kind = "complex"; break;
    case nb::dlpack::dtype_code::Bool: return "bool";
    default: kind = "dtype" + std::to_string(dt.code) + "_"; break;
  }
  return kind + std::to_string(dt.bits);
}

std::string strides_string(const AnyArray& a) {  // in bytes, as numpy prints them
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) {
    if (i) s += ", ";
    s += std::to_string(a.stride(i) * (int64_t)a.itemsize());
  }
  return s + (a.ndim() == 1 ? ",)" : ")");
}

GgmlType parse_type(const std::string& name) {
  const auto type = ggml_type_from_name(name);
  if (!type)
    throw ArgValueError("unknown quantization type '" + name +
                        "'; expected one of " + supported_type_list());
  return *type;
}

void check_cpu_array(const AnyArray& a, const char* arg, nb::dlpack::dtype want,
                     const char* want_name) {
  if (a.device_type() != nb::device::cpu::value)
    throw ArgTypeError(std::string(arg) + " must be in CPU memory (a numpy array)");
  if (a.dtype() != want)
    throw ArgTypeError(std::string(arg) + " must have dtype " + want_name + ", got " +
                       dtype_name(a.dtype()));
  if (!c_contiguous(a))
    throw ArgValueError(std::string(arg) + " must be C-contiguous; got shape " + shape_str(a) +
                        " with strides " + strides_string(a) + " (use numpy.ascontiguousarray)");
}

nb::ndarray<nb::numpy, uint8_t, nb::ndim<2>> quantize_array(const AnyArray& array,
                                                            const std::string& type_name) {
  const GgmlType type = parse_type(type_name);
  check_cpu_array(array, "array", nb::dtype<float>(), "float32");
  if (array.ndim() != 1 && array.ndim() != 2)
    throw ArgValueError("array must be 1-D (one row) or 2-D (rows, cols), got shape " +
                        shape_str(array));
  const int64_t rows = array.ndim() == 2 ? (int64_t)array.shape(0) : 1;
  const int64_t cols = (int64_t)array.shape(array.ndim() - 1);
  check_quantize_args(type, cols);
  const int64_t row_bytes = quantized_row_bytes(type, cols);

  std::unique_ptr<uint8_t[]> out(new uint8_t[(size_t)std::max<int64_t>(rows * row_bytes, 1)]);
  {
    nb::gil_scoped_release no_gil;
    quantize(type, static_cast<const float*>(array.data()), rows, cols, out.get());
  }
  uint8_t* raw = out.release();
  nb::capsule owner(raw, [](void* p) noexcept { delete[] static_cast<uint8_t*>(p); });
  const size_t shape[2] = {(size_t)rows, (size_t)row_bytes};
  return nb::ndarray<nb::numpy, uint8_t, nb::ndim<2>>(raw, 2, shape, owner);
}

nb::ndarray<nb::numpy, float> dequantize_array(const AnyArray& data, const std::string& type_name,
                                               const std::vector<int64_t>& shape) {
  const GgmlType type = parse_type(type_name);
  check_cpu_array(data, "data", nb::dtype<uint8_t>(), "uint8");
  if (shape.size() != 1 && shape.size() != 2)
    throw ArgValueError("shape must be (cols,) or (rows, cols), got " +
                        std::to_string(shape.size()) + " dimensions");
  for (int64_t s : shape)
    if (s < 0) throw ArgValueError("shape must not be negative, got " + std::to_string(s));
  const int64_t rows = shape.size() == 2 ? shape[0] : 1;
  const int64_t cols = shape.back();
  check_dequantize_args(type, cols);
  const int64_t row_bytes = quantized_row_bytes(type, cols);
  if ((int64_t)data.size() != rows * row_bytes)
    throw ArgValueError("data holds " + std::to_string(data.size()) + " bytes, but " +
                        std::to_string(rows) + " rows of " + std::to_string(cols) + " " +
                        type_name + " elements need " + std::to_string(rows * row_bytes) + " (" +
                        std::to_string(row_bytes) + " per row)");

  std::unique_ptr<float[]> out(new float[(size_t)std::max<int64_t>(rows * cols, 1)]);
  std::unique_ptr<uint8_t[]> aligned;
  const uint8_t* bytes = aligned_blocks(static_cast<const uint8_t*>(data.data()), data.size(), aligned);
  {
    nb::gil_scoped_release no_gil;
    dequantize(type, bytes, rows, cols, out.get());
  }
  float* raw = out.release();
  nb::capsule owner(raw, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  const size_t out_shape[2] = {(size_t)shape[0], shape.size() == 2 ? (size_t)shape[1] : 0};
  return nb::ndarray<nb::numpy, float>(raw, shape.size(), out_shape, owner);
}

}  // namespace

void bind_quant(nb::module_& m) {
  m.def("_quantize", &quantize_array, nb::arg("array"), nb::arg("type"),
        "Quantize a C-contiguous float32 (rows, cols) or (cols,) array to a (rows, row_bytes) "
        "uint8 array of GGUF blocks. Public wrapper: muser.quantize.");
  m.def("_dequantize", &dequantize_array, nb::arg("data"), nb::arg("type"), nb::arg("shape"),
        "Decode C-contiguous uint8 GGUF block bytes to a float32 array of `shape`. "
        "Public wrapper: muser.dequantize.");
}

}  // namespace muser::py

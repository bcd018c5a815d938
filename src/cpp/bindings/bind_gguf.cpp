// muser.GGUFFile: the C++ reader (gguf.h) seen from Python. Metadata values
// are converted on access (arrays become lists then, not at open); tensor
// bytes are zero-copy read-only numpy views whose owner keeps the mmap alive.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>

#include <string>

#include "bindings.h"
#include "gguf.h"
#include "quant_types.h"

namespace nb = nanobind;

namespace muser::py {

namespace {

// Python-facing tensor description; `offset` is absolute in the file (the C++
// struct keeps the stored, data-section-relative offset).
struct TensorInfoView {
  std::string name;
  std::string type;  // "Q5_K"
  uint32_t type_id;
  nb::tuple shape;   // GGUF order: ne0 (the row length) first
  uint64_t offset;   // absolute file offset of the first byte
  uint64_t nbytes;
};

TensorInfoView make_view(const GGUFFile& f, const GGUFTensorInfo& t) {
  nb::list shape;
  for (int64_t d : t.shape) shape.append(d);
  return {t.name, type_traits(t.type).name, t.type, nb::tuple(shape), f.data_offset() + t.offset, t.nbytes};
}

nb::object decode_utf8(std::string_view s, const char* errors) {
  PyObject* o = PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), errors);
  if (!o) throw nb::python_error();
  return nb::steal(o);
}

// One metadata value as a Python object. Scalar strings were validated as
// UTF-8 at open; array elements were not, so they decode with replacement.
nb::object to_python(const GGUFValue& v, bool in_array) {
  switch (v.type) {
    case GGUFType::BOOL: return nb::bool_(v.as_int() != 0);
    case GGUFType::FLOAT32:
    case GGUFType::FLOAT64: return nb::float_(v.as_double());
    case GGUFType::UINT64: return nb::steal(PyLong_FromUnsignedLongLong(v.as_uint()));
    case GGUFType::STRING: return decode_utf8(v.as_string(), in_array ? "replace" : "strict");
    case GGUFType::ARRAY: {
      PyObject* list = PyList_New(static_cast<Py_ssize_t>(v.count));
      if (!list) throw nb::python_error();
      nb::object owner = nb::steal(list);
      Py_ssize_t i = 0;
      v.for_each_element([&](const GGUFValue& e) {
        // PyList_SetItem steals the reference.
        PyList_SetItem(list, i++, to_python(e, true).release().ptr());
      });
      return owner;
    }
    default: return nb::int_(v.as_int());
  }
}

const GGUFKV& kv_or_key_error(const GGUFFile& f, std::string_view key) {
  const GGUFKV* kv = f.find(key);
  if (!kv) throw nb::key_error(std::string(key).c_str());
  return *kv;
}

}  // namespace

void bind_gguf(nb::module_& m) {
  nb::class_<TensorInfoView>(m, "TensorInfo", "One tensor of a GGUF file (read-only).")
      .def_ro("name", &TensorInfoView::name)
      .def_ro("type", &TensorInfoView::type, "ggml type name, e.g. 'Q5_K'")
      .def_ro("type_id", &TensorInfoView::type_id, "ggml type id as stored")
      .def_ro("shape", &TensorInfoView::shape, "GGUF order: shape[0] is the row length (ne0)")
      .def_ro("offset", &TensorInfoView::offset, "absolute file offset of the tensor's first byte")
      .def_ro("nbytes", &TensorInfoView::nbytes)
      .def("__repr__", [](const TensorInfoView& t) {
        return "TensorInfo(name=" + nb::cast<std::string>(nb::repr(nb::str(t.name.c_str(), t.name.size()))) +
               ", type=" + t.type + ", shape=" + nb::cast<std::string>(nb::repr(t.shape)) +
               ", offset=" + std::to_string(t.offset) + ", nbytes=" + std::to_string(t.nbytes) + ")";
      });

  nb::class_<GGUFFile>(m, "GGUFFile",
                       "A GGUF file, memory-mapped read-only and validated at open.\n\n"
                       "Raises muser.GGUFError (naming the path and byte offset) on a malformed\n"
                       "file. Metadata is read like a mapping: f[key], key in f, f.get(key),\n"
                       "f.keys(). Tensor bytes are zero-copy views of the mapping; the mapping\n"
                       "lives as long as the file object or any view of it.")
      .def(nb::new_([](const std::filesystem::path& path) { return GGUFFile::open(path.string()); }),
           nb::arg("path"))
      .def_prop_ro("path", &GGUFFile::path)
      .def_prop_ro("version", &GGUFFile::version)
      .def_prop_ro("alignment", &GGUFFile::alignment)
      .def_prop_ro("data_offset", &GGUFFile::data_offset, "absolute file offset of the data section")
      .def_prop_ro("file_size", &GGUFFile::file_size)
      .def("keys", [](const GGUFFile& f) {
        nb::list keys;
        for (const GGUFKV& kv : f.metadata()) keys.append(nb::str(kv.key.c_str(), kv.key.size()));
        return keys;
      }, "Metadata keys in file order.")
      .def("__iter__", [](const GGUFFile& f) {
        nb::list keys;
        for (const GGUFKV& kv : f.metadata()) keys.append(nb::str(kv.key.c_str(), kv.key.size()));
        return nb::iter(keys);
      })
      .def("__len__", [](const GGUFFile& f) { return f.metadata().size(); })
      .def("__contains__", [](const GGUFFile& f, std::string_view key) { return f.find(key) != nullptr; })
      .def("__getitem__", [](const GGUFFile& f, std::string_view key) {
        return to_python(kv_or_key_error(f, key).value, false);
      })
      .def("get", [](const GGUFFile& f, std::string_view key, nb::object fallback) {
        const GGUFKV* kv = f.find(key);
        return kv ? to_python(kv->value, false) : fallback;
      }, nb::arg("key"), nb::arg("default") = nb::none())
      .def("value_type", [](const GGUFFile& f, std::string_view key) {
        return kv_or_key_error(f, key).type_name();
      }, nb::arg("key"), "The stored type name, e.g. 'UINT32' or 'ARRAY[STRING]'.")
      .def_prop_ro("tensors", [](const GGUFFile& f) {
        nb::list out;
        for (const GGUFTensorInfo& t : f.tensors()) out.append(make_view(f, t));
        return out;
      }, "TensorInfo of every tensor, in file order.")
      .def("tensor", [](const GGUFFile& f, std::string_view name) {
        const GGUFTensorInfo* t = f.find_tensor(name);
        if (!t) throw nb::key_error(std::string(name).c_str());
        return make_view(f, *t);
      }, nb::arg("name"))
      .def("tensor_bytes", [](const GGUFFile& f, std::string_view name) {
        const GGUFTensorInfo* t = f.find_tensor(name);
        if (!t) throw nb::key_error(std::string(name).c_str());
        // The capsule holds a reference to the file, so the view outlives
        // both this call and the Python GGUFFile object.
        auto* keep = new std::shared_ptr<const GGUFFile>(f.shared_from_this());
        nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<std::shared_ptr<const GGUFFile>*>(p); });
        const size_t shape[1] = {static_cast<size_t>(t->nbytes)};
        return nb::ndarray<nb::numpy, const uint8_t, nb::ndim<1>>(f.tensor_data(*t), 1, shape, owner);
      }, nb::arg("name"), "The tensor's bytes: a zero-copy, read-only uint8 view of the mapping.")
      .def("__enter__", [](nb::object self) { return self; })
      .def("__exit__", [](const GGUFFile&, nb::args) { return false; })
      .def("__repr__", [](const GGUFFile& f) {
        return "GGUFFile(" + nb::cast<std::string>(nb::repr(nb::str(f.path().c_str(), f.path().size()))) +
               ", version=" + std::to_string(f.version()) + ", keys=" + std::to_string(f.metadata().size()) +
               ", tensors=" + std::to_string(f.tensors().size()) + ")";
      });
}

}  // namespace muser::py

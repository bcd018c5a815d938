// What the bindings check of the arrays they are handed, written once.
#pragma once
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace muser::py {

using AnyArray = nanobind::ndarray<nanobind::ro>;

// A shape as numpy prints it: "(2, 3)", "(5,)".
inline std::string shape_str(const AnyArray& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

// Whether a is C-contiguous (nanobind's strides count elements; an empty array is).
inline bool c_contiguous(const AnyArray& a) {
  for (size_t i = 0; i < a.ndim(); ++i)
    if (a.shape(i) == 0) return true;
  int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect) return false;
    expect *= (int64_t)a.shape(i);
  }
  return true;
}

// A new [rows, cols] numpy array that owns its memory (uninitialized).
template <class T>
nanobind::ndarray<nanobind::numpy, T, nanobind::ndim<2>> owned(size_t rows, size_t cols) {
  T* p = new T[rows * cols > 0 ? rows * cols : 1];
  nanobind::capsule owner(p, [](void* q) noexcept { delete[] static_cast<T*>(q); });
  size_t shape[2] = {rows, cols};
  return nanobind::ndarray<nanobind::numpy, T, nanobind::ndim<2>>(p, 2, shape, owner);
}

// A new 1-D numpy array that takes over v's values.
template <class T>
nanobind::ndarray<nanobind::numpy, T, nanobind::ndim<1>> owned_array(std::vector<T>&& v) {
  auto* heap = new std::vector<T>(std::move(v));
  nanobind::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  size_t shape[1] = {heap->size()};
  return nanobind::ndarray<nanobind::numpy, T, nanobind::ndim<1>>(heap->data(), 1, shape, owner);
}

}  // namespace muser::py

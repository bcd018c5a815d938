// What the bindings check of the arrays they are handed, written once.
#pragma once
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>

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

}  // namespace muser::py

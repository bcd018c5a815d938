// muser's C++ exceptions. The bindings translate each to the Python class of
// the same name (all derive from muser.Error); messages name the file, byte
// offset, tensor, key or argument and say what was expected and what was got.
#pragma once
#include <stdexcept>
#include <string>

namespace muser {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// A malformed or hostile GGUF file (message carries path and byte offset).
struct GGUFError : Error {
  using Error::Error;
};
// The path does not exist (Python: muser.GGUFError that is also a FileNotFoundError).
struct GGUFNotFound : GGUFError {
  using GGUFError::GGUFError;
};
// A well-formed file that lacks what the head needs, or a bad override.
struct SpecError : Error {
  using Error::Error;
};
// A backend that was not built, or a device that is absent or failed.
struct DeviceError : Error {
  using Error::Error;
};
// A hidden state holding NaN or +-inf (Python: muser.NonFiniteError, also a ValueError).
struct NonFiniteError : Error {
  using Error::Error;
};
// Caller mistakes the bindings map to TypeError / ValueError.
struct ArgTypeError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};
struct ArgValueError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

}  // namespace muser

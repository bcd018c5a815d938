// GGUF files built byte by byte for the C++ tests: little-endian fields
// appended to a buffer, so each field can be written (or corrupted) alone.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gguf.h"

namespace muser_test {

struct Bytes {
  std::vector<uint8_t> b;
  template <class T>
  Bytes& put(T v) {
    uint8_t raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    b.insert(b.end(), raw, raw + sizeof(T));
    return *this;
  }
  Bytes& str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& kv_header(const std::string& key, muser::GGUFType t) { return str(key).put<uint32_t>(static_cast<uint32_t>(t)); }
  Bytes& pad_to(size_t alignment) {
    while (b.size() % alignment) b.push_back(0);
    return *this;
  }
};

}  // namespace muser_test

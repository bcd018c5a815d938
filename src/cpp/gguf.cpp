// GGUF reader: mmap + bounds-checked parse. See gguf.h for the contract.
//
// File layout (v2/v3, little-endian):
//   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv x (string key, u32 type, value)
//   n_tensors x (string name, u32 n_dims, u64 dims[n_dims], u32 ggml type, u64 offset)
//   padding to `alignment` | data section (tensor offsets are relative to it)
// A string is u64 length + bytes; an array value is u32 element type + u64
// count + elements (an element may itself be an array).
#include "gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "errors.h"
#include "quant_types.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader decodes little-endian fields with memcpy: a little-endian host is required"
#endif

namespace muser {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxArrayDepth = 8;        // arrays of arrays deeper than this are rejected
constexpr uint32_t kMaxDims = 4;         // GGML_MAX_DIMS
constexpr uint64_t kDefaultAlignment = 32;
constexpr uint64_t kMinAlignment = 8;
// Smallest possible encodings, used to reject counts the remaining bytes cannot hold.
constexpr uint64_t kMinKVBytes = 8 + 1 + 4 + 1;              // key len, 1-byte key, type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;  // name len, name, n_dims, 1 dim, type, offset
constexpr uint64_t kMinStringBytes = 8;                      // empty string: its length
constexpr uint64_t kMinArrayBytes = 4 + 8;                   // empty array: element type and count

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

bool is_known_type(uint32_t t) { return t <= static_cast<uint32_t>(GGUFType::FLOAT64); }

// Decimal of an unsigned 128-bit product, for messages about counts that
// overflow 64 bits.
std::string u128_to_string(unsigned __int128 v) {
  if (v == 0) return "0";
  std::string s;
  while (v) {
    s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  }
  return s;
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08" PRIx32, v);
  return buf;
}

// A key or name quoted for a message, cut short so a hostile 1 GB string does
// not become a 1 GB message. Only called on strings already checked as UTF-8.
std::string quoted(std::string_view s) {
  constexpr size_t kMax = 80;
  if (s.size() <= kMax) return "'" + std::string(s) + "'";
  size_t cut = kMax;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // stay on a code point
  return "'" + std::string(s.substr(0, cut)) + "...' (" + std::to_string(s.size()) + " bytes)";
}

// Total file bytes of `count` elements of `elem` starting at p. Only used on
// arrays the parser has already walked and bounds-checked.
uint64_t elements_bytes(GGUFType elem, uint64_t count, const uint8_t* p) {
  const uint64_t fixed = gguf_scalar_size(elem);
  if (fixed) return count * fixed;
  const uint8_t* q = p;
  for (uint64_t i = 0; i < count; ++i) {
    if (elem == GGUFType::STRING) {
      q += 8 + load<uint64_t>(q);
    } else {  // ARRAY
      const auto inner = static_cast<GGUFType>(load<uint32_t>(q));
      const uint64_t n = load<uint64_t>(q + 4);
      q += kMinArrayBytes;
      q += elements_bytes(inner, n, q);
    }
  }
  return static_cast<uint64_t>(q - p);
}

// Sequential, bounds-checked reads over the mapped file. Every failure names
// the path and a byte offset.
class Reader {
 public:
  Reader(const std::string& path, const uint8_t* base, uint64_t size)
      : path_(path), base_(base), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }
  const uint8_t* here() const { return base_ + pos_; }

  [[noreturn]] void fail(uint64_t at, const std::string& what) const {
    throw GGUFError(path_ + ": at byte " + std::to_string(at) + ": " + what);
  }

  // `what` (a const char* or std::string) becomes a message only on failure:
  // these run once per string of a 262,144-entry vocabulary.
  template <class What>
  void need(uint64_t n, const What& what) const {
    if (n > remaining()) truncated(n, what);
  }
  template <class What>
  void skip(uint64_t n, const What& what) {
    need(n, what);
    pos_ += n;
  }
  // For hot loops that have just checked `n <= remaining()` themselves.
  void advance(uint64_t n) { pos_ += n; }
  uint32_t u32(const char* what) {
    need(4, what);
    const uint32_t v = load<uint32_t>(here());
    pos_ += 4;
    return v;
  }
  uint64_t u64(const char* what) {
    need(8, what);
    const uint64_t v = load<uint64_t>(here());
    pos_ += 8;
    return v;
  }
  // A length-prefixed string as a view into the mmap.
  std::string_view str(const char* what) {
    const uint64_t len = u64(what);
    if (len > remaining()) truncated(len, std::string(what) + " of length " + std::to_string(len));
    std::string_view s(reinterpret_cast<const char*>(here()), len);
    pos_ += len;
    return s;
  }
  [[noreturn]] void truncated(uint64_t n, const std::string& what) const {
    fail(pos_, "truncated: " + what + " needs " + std::to_string(n) + " bytes but only " +
                   std::to_string(remaining()) + " remain");
  }
  // Rejects a count of items, each at least `min_bytes` long, that the rest
  // of the file cannot hold -- before the count drives any loop or allocation.
  void check_count(uint64_t at, uint64_t count, uint64_t min_bytes, const std::string& what) const {
    if (count > remaining() / min_bytes) {
      const unsigned __int128 needed = static_cast<unsigned __int128>(count) * min_bytes;
      fail(at, what + " count " + std::to_string(count) + " needs at least " + u128_to_string(needed) +
                   " bytes but only " + std::to_string(remaining()) + " remain");
    }
  }

 private:
  const std::string& path_;
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

// Parses one value of `type` at the reader's position (after the type tag),
// checking every byte it spans. `depth` counts the arrays around it.
// `validate_utf8` is on for scalar strings (the head reads them) and off for
// array elements (a 262,144-entry vocabulary is decoded lazily, with
// replacement, by whoever reads it).
GGUFValue parse_value(Reader& r, GGUFType type, int depth, bool validate_utf8, const std::string& what) {
  GGUFValue v;
  v.type = type;
  const uint64_t start = r.pos();
  if (const uint64_t fixed = gguf_scalar_size(type)) {
    r.need(fixed, what);
    v.data = r.here();
    if (type == GGUFType::BOOL && *v.data > 1)
      r.fail(start, what + " is a BOOL stored as " + std::to_string(*v.data) + ", expected 0 or 1");
    r.skip(fixed, what);
  } else if (type == GGUFType::STRING) {
    const std::string_view s = r.str(what.c_str());
    v.data = reinterpret_cast<const uint8_t*>(s.data());
    if (validate_utf8 && !is_valid_utf8(v.data, s.size()))
      r.fail(start + 8, what + " is not valid UTF-8");
  } else {  // ARRAY
    if (depth >= kMaxArrayDepth)
      r.fail(start, what + " nests arrays deeper than " + std::to_string(kMaxArrayDepth) + " levels");
    const uint32_t elem = r.u32((what + " element type").c_str());
    if (!is_known_type(elem)) r.fail(start, what + " has unknown element type " + std::to_string(elem));
    v.elem_type = static_cast<GGUFType>(elem);
    const uint64_t count_at = r.pos();
    v.count = r.u64((what + " element count").c_str());
    const uint64_t elem_bytes = gguf_scalar_size(v.elem_type);  // 0: strings, arrays
    const uint64_t min_elem = elem_bytes ? elem_bytes : v.elem_type == GGUFType::STRING ? kMinStringBytes : kMinArrayBytes;
    r.check_count(count_at, v.count, min_elem,
                  what + " (ARRAY[" + gguf_type_name(v.elem_type) + "]) element");
    v.data = r.here();
    if (elem_bytes) {
      if (v.elem_type == GGUFType::BOOL) {
        for (uint64_t i = 0; i < v.count; ++i)
          if (v.data[i] > 1)
            r.fail(r.pos() + i, what + "[" + std::to_string(i) + "] is a BOOL stored as " +
                                    std::to_string(v.data[i]) + ", expected 0 or 1");
      }
      r.skip(v.count * elem_bytes, what);  // cannot fail: check_count covered it
    } else if (v.elem_type == GGUFType::STRING) {
      // Walk the length prefixes only, with no allocation per string (not
      // even for a message, built only on failure): this loop runs 262,144
      // times on a real vocabulary.
      for (uint64_t i = 0; i < v.count; ++i) {
        const uint64_t len = r.u64("string array element length");
        if (len > r.remaining())
          r.need(len, what + "[" + std::to_string(i) + "] of length " + std::to_string(len));
        r.advance(len);
      }
    } else {
      for (uint64_t i = 0; i < v.count; ++i)
        parse_value(r, GGUFType::ARRAY, depth + 1, false, what + "[" + std::to_string(i) + "]");
    }
  }
  v.size = r.pos() - start;
  return v;
}

}  // namespace

// ---------------------------------------------------------------- types

const char* gguf_type_name(GGUFType t) {
  switch (t) {
    case GGUFType::UINT8: return "UINT8";
    case GGUFType::INT8: return "INT8";
    case GGUFType::UINT16: return "UINT16";
    case GGUFType::INT16: return "INT16";
    case GGUFType::UINT32: return "UINT32";
    case GGUFType::INT32: return "INT32";
    case GGUFType::FLOAT32: return "FLOAT32";
    case GGUFType::BOOL: return "BOOL";
    case GGUFType::STRING: return "STRING";
    case GGUFType::ARRAY: return "ARRAY";
    case GGUFType::UINT64: return "UINT64";
    case GGUFType::INT64: return "INT64";
    case GGUFType::FLOAT64: return "FLOAT64";
  }
  return "UNKNOWN";
}

uint64_t gguf_scalar_size(GGUFType t) {
  switch (t) {
    case GGUFType::UINT8:
    case GGUFType::INT8:
    case GGUFType::BOOL: return 1;
    case GGUFType::UINT16:
    case GGUFType::INT16: return 2;
    case GGUFType::UINT32:
    case GGUFType::INT32:
    case GGUFType::FLOAT32: return 4;
    case GGUFType::UINT64:
    case GGUFType::INT64:
    case GGUFType::FLOAT64: return 8;
    default: return 0;
  }
}

bool gguf_is_integer(GGUFType t) {
  switch (t) {
    case GGUFType::UINT8:
    case GGUFType::INT8:
    case GGUFType::UINT16:
    case GGUFType::INT16:
    case GGUFType::UINT32:
    case GGUFType::INT32:
    case GGUFType::UINT64:
    case GGUFType::INT64:
    case GGUFType::BOOL: return true;
    default: return false;
  }
}

bool gguf_is_float(GGUFType t) { return t == GGUFType::FLOAT32 || t == GGUFType::FLOAT64; }

bool is_valid_utf8(const uint8_t* p, uint64_t n) {
  uint64_t i = 0;
  while (i < n) {
    const uint8_t c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;  // stray continuation byte or 0xF8..0xFF
    }
    if (n - i < static_cast<uint64_t>(len)) return false;
    for (int k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    static constexpr uint32_t kMinForLen[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLen[len]) return false;               // overlong
    if (cp > 0x10FFFF) return false;                      // beyond Unicode
    if (cp >= 0xD800 && cp <= 0xDFFF) return false;       // surrogate
    i += len;
  }
  return true;
}

// ---------------------------------------------------------------- GGUFValue

double GGUFValue::as_double() const {
  switch (type) {
    case GGUFType::FLOAT32: return load<float>(data);
    case GGUFType::FLOAT64: return load<double>(data);
    case GGUFType::UINT64: return static_cast<double>(as_uint());
    default: return static_cast<double>(as_int());  // integers; anything else throws there
  }
}

int64_t GGUFValue::as_int() const {
  switch (type) {
    case GGUFType::UINT8: return load<uint8_t>(data);
    case GGUFType::INT8: return load<int8_t>(data);
    case GGUFType::UINT16: return load<uint16_t>(data);
    case GGUFType::INT16: return load<int16_t>(data);
    case GGUFType::UINT32: return load<uint32_t>(data);
    case GGUFType::INT32: return load<int32_t>(data);
    case GGUFType::UINT64: return static_cast<int64_t>(load<uint64_t>(data));
    case GGUFType::INT64: return load<int64_t>(data);
    case GGUFType::BOOL: return load<uint8_t>(data) != 0;
    default:
      // a float has no exact integer value in general (and one out of range
      // would be undefined behaviour to convert): callers ask as_double
      throw SpecError(std::string("GGUF value of type ") + gguf_type_name(type) + " read as an integer");
  }
}

uint64_t GGUFValue::as_uint() const {
  return type == GGUFType::UINT64 ? load<uint64_t>(data) : static_cast<uint64_t>(as_int());
}

std::string_view GGUFValue::as_string() const {
  if (type != GGUFType::STRING) return {};
  return {reinterpret_cast<const char*>(data), static_cast<size_t>(size - 8)};
}

GGUFValue GGUFValue::element_at(const uint8_t* p) const {
  GGUFValue v;
  v.type = elem_type;
  if (const uint64_t fixed = gguf_scalar_size(elem_type)) {
    v.data = p;
    v.size = fixed;
  } else if (elem_type == GGUFType::STRING) {
    v.data = p + 8;
    v.size = 8 + load<uint64_t>(p);
  } else {
    v.elem_type = static_cast<GGUFType>(load<uint32_t>(p));
    v.count = load<uint64_t>(p + 4);
    v.data = p + kMinArrayBytes;
    v.size = kMinArrayBytes + elements_bytes(v.elem_type, v.count, v.data);
  }
  return v;
}

GGUFValue GGUFValue::element(uint64_t i) const {
  if (type != GGUFType::ARRAY) throw std::invalid_argument("GGUFValue::element on a non-array value");
  if (i >= count)
    throw std::out_of_range("array index " + std::to_string(i) + " out of range for " +
                            std::to_string(count) + " elements");
  if (const uint64_t fixed = gguf_scalar_size(elem_type)) return element_at(data + i * fixed);
  const uint8_t* p = data;
  for (uint64_t k = 0; k < i; ++k) p += element_at(p).size;
  return element_at(p);
}

// ---------------------------------------------------------------- GGUFKV

namespace {
[[noreturn]] void wrong_type(const GGUFKV& kv, const char* expected) {
  throw SpecError("metadata key '" + kv.key + "' has type " + kv.type_name() + ", expected " + expected);
}
}  // namespace

double GGUFKV::as_double() const {
  if (!value.is_number()) wrong_type(*this, "a number");
  return value.as_double();
}

int64_t GGUFKV::as_int() const {
  if (!gguf_is_integer(type)) wrong_type(*this, "an integer");
  if (type == GGUFType::UINT64 && value.as_uint() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    throw SpecError("metadata key '" + key + "' is " + std::to_string(value.as_uint()) +
                    ", beyond the int64 range");
  return value.as_int();
}

std::string_view GGUFKV::as_string() const {
  if (type != GGUFType::STRING) wrong_type(*this, "a string");
  return value.as_string();
}

std::string GGUFKV::type_name() const {
  if (type != GGUFType::ARRAY) return gguf_type_name(type);
  return std::string("ARRAY[") + gguf_type_name(elem_type) + "]";
}

// ---------------------------------------------------------------- GGUFTensorInfo

int64_t GGUFTensorInfo::nelements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // cannot overflow: checked at open
  return n;
}

int64_t GGUFTensorInfo::rows() const {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

int64_t GGUFTensorInfo::row_bytes() const {
  const TypeTraits tt = type_traits(type);
  return shape.empty() || tt.block_elems == 0 ? 0 : shape[0] / tt.block_elems * tt.block_bytes;
}

// ---------------------------------------------------------------- GGUFFile

std::shared_ptr<GGUFFile> GGUFFile::open(const std::string& path, Load how) {
  std::shared_ptr<GGUFFile> f(new GGUFFile());
  f->path_ = path;
  f->map(path, how);
  f->parse();
  return f;
}

std::shared_ptr<GGUFFile> GGUFFile::from_bytes(const std::string& name, const uint8_t* data, size_t size) {
  std::shared_ptr<GGUFFile> f(new GGUFFile());
  f->path_ = name;
  f->file_size_ = size;
  if (size > 0) {
    uint8_t* p = f->anonymous(size);
    std::memcpy(p, data, size);
    f->seal();
  }
  f->parse();
  return f;
}

GGUFFile::~GGUFFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), static_cast<size_t>(file_size_));
  if (fd_ >= 0) ::close(fd_);
}

uint8_t* GGUFFile::anonymous(uint64_t size) {
  // page-aligned like a file mapping, so tensor addresses keep the file's alignment
  void* p = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw GGUFError(path_ + ": cannot allocate " + std::to_string(size) + " bytes for a private copy: " +
                    std::strerror(errno));
  base_ = static_cast<const uint8_t*>(p);
  return static_cast<uint8_t*>(p);
}

void GGUFFile::seal() {
  ::mprotect(const_cast<uint8_t*>(base_), static_cast<size_t>(file_size_), PROT_READ);
}

namespace {

FileIdentity identity_of(const struct stat& st) {
  FileIdentity id;
  id.device = static_cast<uint64_t>(st.st_dev);
  id.inode = static_cast<uint64_t>(st.st_ino);
  id.size = static_cast<uint64_t>(st.st_size);
#if defined(__APPLE__)
  id.mtime_ns = (int64_t)st.st_mtimespec.tv_sec * 1000000000 + st.st_mtimespec.tv_nsec;
  id.ctime_ns = (int64_t)st.st_ctimespec.tv_sec * 1000000000 + st.st_ctimespec.tv_nsec;
#else
  id.mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
  id.ctime_ns = (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec;
#endif
  return id;
}

}  // namespace

void GGUFFile::map(const std::string& path, Load how) {
  if (path.find('\0') != std::string::npos)
    throw GGUFError("the path " + quoted(path.substr(0, path.find('\0'))) + "... holds a NUL byte");
  // O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer; a
  // regular file ignores the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) throw GGUFNotFound(path + ": cannot open: " + std::strerror(err));
    throw GGUFError(path + ": cannot open: " + std::strerror(err));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw GGUFError(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    const char* kind = S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" :
                       S_ISSOCK(st.st_mode) ? "a socket" : S_ISCHR(st.st_mode) ? "a character device" :
                       S_ISBLK(st.st_mode) ? "a block device" : "not a regular file";
    throw GGUFError(path + ": is " + std::string(kind) + ", expected a regular GGUF file");
  }
  identity_ = identity_of(st);
  file_size_ = static_cast<uint64_t>(st.st_size);
  if (file_size_ == 0) {  // mmap of 0 bytes fails; parse() then reports the empty file
    ::close(fd);
    return;
  }
  if (how == Load::Copy) {
    uint8_t* p = anonymous(file_size_);
    uint64_t got = 0;
    while (got < file_size_) {
      const ssize_t n = ::pread(fd, p + got, static_cast<size_t>(std::min<uint64_t>(file_size_ - got, 1u << 30)),
                                static_cast<off_t>(got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n < 0 ? errno : 0;
        ::close(fd);
        throw GGUFError(path + ": read " + std::to_string(got) + " of " + std::to_string(file_size_) +
                        " bytes: " + (err ? std::strerror(err) : "the file shrank while it was read"));
      }
      got += static_cast<uint64_t>(n);
    }
    ::close(fd);
    seal();
    return;
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(file_size_), PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    ::close(fd);
    throw GGUFError(path + ": cannot mmap " + std::to_string(file_size_) + " bytes: " + std::strerror(err));
  }
  base_ = static_cast<const uint8_t*>(p);
  fd_ = fd;  // kept to check the mapped file's identity before each use (check_unchanged)
}

void GGUFFile::check_unchanged() const {
  if (fd_ < 0) return;  // a private copy, or bytes: nothing can change under it
  struct stat st;
  if (::fstat(fd_, &st) != 0)
    throw GGUFError(path_ + ": cannot stat the mapped file: " + std::strerror(errno));
  const FileIdentity now = identity_of(st);
  if (now == identity_) return;
  std::string what = now.size != identity_.size
                         ? "its size went from " + std::to_string(identity_.size) + " to " + std::to_string(now.size) +
                               " bytes"
                         : now.mtime_ns != identity_.mtime_ns
                               ? "it was modified: its mtime changed"
                               : "its inode changed: ctime moved (a chmod, rename, unlink or a write with mtime reset)";
  throw GGUFError(path_ + ": the file changed after it was loaded (" + what +
                  "); the mapped weights may no longer be what was validated. Load it again, or load with "
                  "mmap=False for a private copy");
}

void GGUFFile::parse() {
  Reader r(path_, base_, file_size_);

  // ---- header
  if (file_size_ < 4)
    r.fail(0, "truncated: the magic needs 4 bytes but the file has " + std::to_string(file_size_));
  const uint32_t magic = r.u32("magic");
  if (magic != kMagic)
    r.fail(0, "bad magic " + hex32(magic) + " (bytes " + std::to_string(base_[0]) + " " +
                  std::to_string(base_[1]) + " " + std::to_string(base_[2]) + " " + std::to_string(base_[3]) +
                  "), expected \"GGUF\"");
  version_ = r.u32("the version");
  const uint32_t swapped = __builtin_bswap32(version_);
  if ((version_ & 0xFFFF) == 0 && swapped >= 1 && swapped <= 3)
    r.fail(4, "version reads " + hex32(version_) + ": a big-endian GGUF file; muser reads little-endian files only");
  if (version_ != 2 && version_ != 3)
    r.fail(4, "unsupported version " + std::to_string(version_) + " (muser reads GGUF v2 and v3)");
  const uint64_t n_tensors_at = r.pos();
  const uint64_t n_tensors = r.u64("the tensor count");
  const uint64_t n_kv_at = r.pos();
  const uint64_t n_kv = r.u64("the metadata count");
  r.check_count(n_kv_at, n_kv, kMinKVBytes, "metadata");
  r.check_count(n_tensors_at, n_tensors, kMinTensorInfoBytes, "tensor");

  // ---- metadata
  // Reserve only what the file can plausibly hold, never a raw count.
  metadata_.reserve(static_cast<size_t>(std::min<uint64_t>(n_kv, 1024)));
  key_index_.reserve(static_cast<size_t>(std::min<uint64_t>(n_kv, 1024)));
  std::vector<uint64_t> value_type_at;  // for messages about general.alignment
  for (uint64_t i = 0; i < n_kv; ++i) {
    const uint64_t key_at = r.pos();
    const std::string_view key = r.str("metadata key");
    if (key.empty()) r.fail(key_at, "metadata key #" + std::to_string(i) + " is empty");
    if (!is_valid_utf8(reinterpret_cast<const uint8_t*>(key.data()), key.size()))
      r.fail(key_at + 8, "metadata key #" + std::to_string(i) + " is not valid UTF-8");
    if (!key_index_.emplace(key, metadata_.size()).second)
      r.fail(key_at, "duplicate metadata key " + quoted(key));
    const uint64_t type_at = r.pos();
    const uint32_t type = r.u32("value type");
    if (!is_known_type(type))
      r.fail(type_at, "metadata key " + quoted(key) + " has unknown value type " + std::to_string(type));
    GGUFKV kv;
    kv.key = std::string(key);
    kv.type = static_cast<GGUFType>(type);
    kv.value = parse_value(r, kv.type, 0, true, "value of key " + quoted(key));
    kv.elem_type = kv.value.elem_type;
    kv.count = kv.value.count;
    kv.offset = static_cast<uint64_t>(kv.value.data - base_);
    metadata_.push_back(std::move(kv));
    value_type_at.push_back(type_at);
  }

  if (const GGUFKV* a = find("general.alignment")) {
    const uint64_t type_at = value_type_at[key_index_.find("general.alignment")->second];
    if (a->type != GGUFType::UINT32)
      r.fail(type_at, "bad alignment: general.alignment has type " + a->type_name() + ", expected UINT32");
    const uint64_t v = a->value.as_uint();
    // The GGUF specification: a multiple of 8. With a power of two >= 8 every
    // tensor starts 8-byte aligned in the (page-aligned) mapping, so the
    // kernels' 2- and 4-byte block fields are never read at odd addresses.
    if (v < kMinAlignment || (v & (v - 1)) != 0)
      r.fail(a->offset, "bad alignment: general.alignment is " + std::to_string(v) +
                            ", expected a power of two >= " + std::to_string(kMinAlignment) +
                            " (the GGUF specification: a multiple of 8)");
    alignment_ = v;
  } else {
    alignment_ = kDefaultAlignment;
  }

  // ---- tensor table
  r.check_count(r.pos(), n_tensors, kMinTensorInfoBytes, "tensor");
  tensors_.reserve(static_cast<size_t>(std::min<uint64_t>(n_tensors, 4096)));
  tensor_index_.reserve(static_cast<size_t>(std::min<uint64_t>(n_tensors, 4096)));
  std::vector<uint64_t> offset_at;  // where each tensor's offset field is, for the data check below
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const uint64_t name_at = r.pos();
    const std::string_view name = r.str("tensor name");
    if (name.empty()) r.fail(name_at, "tensor #" + std::to_string(i) + " has an empty name");
    if (!is_valid_utf8(reinterpret_cast<const uint8_t*>(name.data()), name.size()))
      r.fail(name_at + 8, "tensor #" + std::to_string(i) + " name is not valid UTF-8");
    if (!tensor_index_.emplace(name, tensors_.size()).second)
      r.fail(name_at, "duplicate tensor name " + quoted(name));
    GGUFTensorInfo t;
    t.name = std::string(name);
    const std::string what = "tensor " + quoted(name);

    const uint64_t n_dims_at = r.pos();
    const uint32_t n_dims = r.u32("tensor dimension count");
    if (n_dims == 0 || n_dims > kMaxDims)
      r.fail(n_dims_at, what + " has " + std::to_string(n_dims) + " dimensions, expected 1 to " +
                            std::to_string(kMaxDims));
    t.shape.reserve(n_dims);
    int64_t nelements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim_at = r.pos();
      const uint64_t dim = r.u64("tensor dimension");
      if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        r.fail(dim_at, what + " dimension " + std::to_string(d) + " is " + std::to_string(dim) +
                           ", expected 1 to 2^63-1");
      const auto sdim = static_cast<int64_t>(dim);
      if (nelements > std::numeric_limits<int64_t>::max() / sdim)
        r.fail(dim_at, what + " element count overflows int64 at dimension " + std::to_string(d));
      nelements *= sdim;
      t.shape.push_back(sdim);
    }

    const uint64_t type_at = r.pos();
    t.type = r.u32("tensor type");
    const TypeTraits tt = type_traits(t.type);
    if (tt.name == nullptr) r.fail(type_at, what + " has unknown ggml type id " + std::to_string(t.type));
    if (t.shape[0] % tt.block_elems != 0)
      r.fail(type_at, what + " row length " + std::to_string(t.shape[0]) + " is not a multiple of the " +
                          tt.name + " block size " + std::to_string(tt.block_elems));
    const uint64_t blocks = static_cast<uint64_t>(nelements / tt.block_elems);
    if (blocks > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(tt.block_bytes))
      r.fail(type_at, what + " byte size overflows 64 bits");
    t.nbytes = blocks * static_cast<uint64_t>(tt.block_bytes);

    offset_at.push_back(r.pos());
    t.offset = r.u64("tensor data offset");
    if (t.offset % alignment_ != 0)
      r.fail(offset_at.back(), what + " data offset " + std::to_string(t.offset) +
                                   " is not a multiple of the alignment " + std::to_string(alignment_));
    tensors_.push_back(std::move(t));
  }

  // ---- data section: starts at the aligned end of the tensor table. With no
  // tensors the padding may be absent, so data_offset may equal or pass the end.
  const uint64_t table_end = r.pos();
  data_offset_ = (table_end + alignment_ - 1) / alignment_ * alignment_;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const GGUFTensorInfo& t = tensors_[i];
    const uint64_t room = data_offset_ <= file_size_ ? file_size_ - data_offset_ : 0;
    if (t.offset > room || t.nbytes > room - t.offset) {
      const unsigned __int128 end = static_cast<unsigned __int128>(data_offset_) + t.offset + t.nbytes;
      r.fail(offset_at[i], "tensor " + quoted(t.name) + " data [" +
                               u128_to_string(static_cast<unsigned __int128>(data_offset_) + t.offset) + ", " +
                               u128_to_string(end) + ") lies outside the file of " +
                               std::to_string(file_size_) + " bytes");
    }
  }
}

const GGUFKV* GGUFFile::find(std::string_view key) const {
  auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &metadata_[it->second];
}

const GGUFTensorInfo* GGUFFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace muser

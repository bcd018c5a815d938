// The GGUF reader: a read-only mmap of the file, a bounds-checked parse of the
// header, metadata and tensor table, and no copies of tensor data.
//
// Every read is checked against the file size before it happens and every
// count is checked against the bytes that remain before it drives a loop or an
// allocation, so a truncated or hostile file ends in a GGUFError naming the
// path, the byte offset and what was wrong -- never a crash, hang or huge
// allocation. Arrays are not materialized at open: a value records where its
// elements start in the mmap, and elements are decoded on demand (a
// 262,144-string tokenizer costs one walk over its length prefixes, no
// allocation per string).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace muser {

// Metadata value types, numbered as stored in the file.
enum class GGUFType : uint32_t {
  UINT8 = 0,
  INT8 = 1,
  UINT16 = 2,
  INT16 = 3,
  UINT32 = 4,
  INT32 = 5,
  FLOAT32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  UINT64 = 10,
  INT64 = 11,
  FLOAT64 = 12,
};

// "UINT32", "STRING", ...; "UNKNOWN" outside the enum.
const char* gguf_type_name(GGUFType t);
// Bytes of one stored value of a fixed-size type; 0 for STRING, ARRAY, unknown.
uint64_t gguf_scalar_size(GGUFType t);
bool gguf_is_integer(GGUFType t);  // UINT8..INT64 and BOOL
bool gguf_is_float(GGUFType t);    // FLOAT32, FLOAT64

// One metadata value, decoded lazily from the mmap it points into. Only
// GGUFFile makes these, after it has checked that the whole value (for an
// array: every element, nested arrays included) lies inside the file, so
// reading one never goes out of bounds. A value is valid while its GGUFFile is.
struct GGUFValue {
  GGUFType type = GGUFType::UINT8;
  const uint8_t* data = nullptr;  // payload in the mmap: the scalar, the string's bytes, an array's first element
  uint64_t size = 0;              // bytes the value occupies in the file, a string's length prefix
                                  // and an array's (type, count) header included
  GGUFType elem_type = GGUFType::UINT8;  // ARRAY only
  uint64_t count = 0;                    // ARRAY only: number of elements

  bool is_number() const { return gguf_is_integer(type) || gguf_is_float(type); }
  // The scalar, converted; callers check the type first (GGUFKV's accessors
  // do and name the key). Unsigned 64-bit values above INT64_MAX wrap in
  // as_int; use as_uint for them.
  double as_double() const;
  int64_t as_int() const;
  uint64_t as_uint() const;
  std::string_view as_string() const;

  // Element i of an ARRAY: O(1) for fixed-size elements, O(i) for strings and
  // nested arrays (which are walked). For a full pass use for_each_element.
  GGUFValue element(uint64_t i) const;
  // Calls fn(const GGUFValue&) on each element in order, in one walk.
  template <class Fn>
  void for_each_element(Fn&& fn) const {
    const uint8_t* p = data;
    for (uint64_t i = 0; i < count; ++i) {
      GGUFValue v = element_at(p);
      fn(v);
      p += v.size;
    }
  }

 private:
  GGUFValue element_at(const uint8_t* p) const;  // element starting at p
};

struct GGUFKV {
  std::string key;
  GGUFType type = GGUFType::UINT8;       // ARRAY for arrays
  GGUFType elem_type = GGUFType::UINT8;  // for arrays
  uint64_t count = 0;                    // for arrays
  uint64_t offset = 0;                   // absolute file offset of the value payload (value.data - base):
                                         // the scalar, the string's bytes, an array's first element
  GGUFValue value;

  bool is_number() const { return value.is_number(); }
  // These throw SpecError("metadata key '<key>' has type <T>, expected ...")
  // when the stored type does not fit.
  double as_double() const;
  int64_t as_int() const;  // integers and bool
  std::string_view as_string() const;
  std::string type_name() const;  // "UINT32", "ARRAY[STRING]", ...
};

struct GGUFTensorInfo {
  std::string name;
  uint32_t type = 0;            // ggml type id
  std::vector<int64_t> shape;   // GGUF order: shape[0] = ne0 = the contiguous (row-length) dimension
  uint64_t offset = 0;          // relative to the data section, as stored
  uint64_t nbytes = 0;          // computed from type_traits and shape

  int64_t nelements() const;
  int64_t rows() const;  // product of shape[1..]
  int64_t row_bytes() const;
};

// What identifies the bytes behind a mapping: a change of any field after
// load means the mapped weights may no longer be what was validated.
struct FileIdentity {
  uint64_t device = 0, inode = 0, size = 0;
  int64_t mtime_ns = 0, ctime_ns = 0;
  bool operator==(const FileIdentity& o) const {
    return device == o.device && inode == o.inode && size == o.size && mtime_ns == o.mtime_ns &&
           ctime_ns == o.ctime_ns;
  }
};

class GGUFFile : public std::enable_shared_from_this<GGUFFile> {
 public:
  // Map: the file is mapped read-only and read in place (check_unchanged()
  // guards against it changing later). Copy: the file is read once into
  // private memory; nothing done to the file afterwards can reach it.
  enum class Load { Map, Copy };
  // Opens and parses the file. Throws GGUFError naming the path (and, for a
  // malformed file, the byte offset) on any failure; GGUFNotFound when the
  // path does not exist. Never blocks on a FIFO or device path.
  static std::shared_ptr<GGUFFile> open(const std::string& path, Load how = Load::Map);
  // Parses a private copy of `size` bytes (`name` stands for the path in messages).
  static std::shared_ptr<GGUFFile> from_bytes(const std::string& name, const uint8_t* data, size_t size);
  ~GGUFFile();
  GGUFFile(const GGUFFile&) = delete;
  GGUFFile& operator=(const GGUFFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return file_size_; }
  const uint8_t* base() const { return base_; }
  // Whether tensor bytes are read from a mapping of the file (Load::Map).
  bool mapped() const { return fd_ >= 0; }
  // Throws GGUFError when the mapped file's identity (size, mtime, ctime,
  // inode) differs from load time. One fstat of the mapped file: cheap next
  // to any step. ctime is part of it so that a rewrite whose mtime was set
  // back is still seen; it also changes on chmod, rename and unlink, so any
  // change to the loaded file is reported, harmless ones included.
  void check_unchanged() const;

  const std::vector<GGUFKV>& metadata() const { return metadata_; }
  const GGUFKV* find(std::string_view key) const;  // nullptr if absent
  const std::vector<GGUFTensorInfo>& tensors() const { return tensors_; }
  const GGUFTensorInfo* find_tensor(std::string_view name) const;  // nullptr if absent
  const uint8_t* tensor_data(const GGUFTensorInfo& t) const {
    return base_ + data_offset_ + t.offset;
  }

 private:
  GGUFFile() = default;
  void map(const std::string& path, Load how);
  uint8_t* anonymous(uint64_t size);  // page-aligned private memory as base_
  void seal();                        // makes that memory read-only
  void parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  int fd_ = -1;  // the mapped file (Load::Map), for check_unchanged
  FileIdentity identity_;
  uint64_t file_size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GGUFKV> metadata_;
  std::vector<GGUFTensorInfo> tensors_;
  // Keyed by views into the mmap (stable for the file's life, unlike the
  // std::string members of the vectors above, which move when they grow).
  std::unordered_map<std::string_view, size_t> key_index_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
};

// True when bytes [p, p+n) are well-formed UTF-8 (no overlongs, surrogates or
// code points above U+10FFFF).
bool is_valid_utf8(const uint8_t* p, uint64_t n);

}  // namespace muser

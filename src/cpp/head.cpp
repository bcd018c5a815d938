#include "head.h"

#include <unistd.h>

#include <atomic>

#include "cpu/parallel.h"
#include "errors.h"
#include "gguf.h"
#include "quant_types.h"

namespace muser {

namespace {

std::vector<float> vector_tensor(const GGUFFile& f, const std::string& name) {
  const GGUFTensorInfo* t = f.find_tensor(name);
  std::vector<float> out((size_t)t->nelements());
  dequant_row(t->type, f.tensor_data(*t), t->nelements(), out.data());
  return out;
}

}  // namespace

RowRange shard_row_range(int64_t vocab, int64_t rank, int64_t world) {
  if (world < 1) throw ArgValueError("shard world must be >= 1, got " + std::to_string(world));
  if (rank < 0 || rank >= world)
    throw ArgValueError("shard rank must be in [0, " + std::to_string(world) + ") (world " + std::to_string(world) +
                        "), got " + std::to_string(rank));
  if (world > vocab)
    throw ArgValueError("shard world " + std::to_string(world) + " exceeds the vocabulary (" + std::to_string(vocab) +
                        " rows): a shard would be empty");
  // rank * vocab < 2^63 for any vocabulary a GGUF tensor can hold and world <= vocab
  return {rank * vocab / world, (rank + 1) * vocab / world};
}

std::shared_ptr<Head> Head::load(const std::string& path, const HeadOptions& options) {
  return from_file(GGUFFile::open(path, options.mmap ? GGUFFile::Load::Map : GGUFFile::Load::Copy), options);
}

std::shared_ptr<Head> Head::from_file(std::shared_ptr<GGUFFile> file, const HeadOptions& options) {
  cpu::check_threads(options.threads);  // every device: the CUDA one takes it too
  std::shared_ptr<Head> h(new Head());
  h->file_ = std::move(file);
  h->options_ = options;
  h->spec_ = read_head_spec(*h->file_, options.overrides);
  h->model_vocab_ = h->spec_.vocab;
  h->rows_ = shard_row_range(h->model_vocab_, options.shard_rank, options.shard_world);
  h->spec_.vocab = h->rows_.count();  // the device sees the shard's rows alone: a smaller weight
  const HeadSpec& s = h->spec_;
  const GGUFTensorInfo* w = h->file_->find_tensor(s.output_weight);
  h->nodes_ = build_route(options.route, s, options.acts);  // before any upload: refuses what cannot run
  // a row range is a contiguous byte range: the shard's rows start rows_.start * row_bytes in
  h->weights_.output = {w->type, s.vocab, s.hidden, w->row_bytes(),
                        h->file_->tensor_data(*w) + h->rows_.start * w->row_bytes()};
  h->weights_.gamma = vector_tensor(*h->file_, s.norm_weight);
  h->weights_.mapping = {h->file_->base(), (size_t)h->file_->file_size(), (size_t)::sysconf(_SC_PAGESIZE)};
  h->device_ = make_device(options.device, options.threads);
  h->device_->prepare(s, h->weights_, h->nodes_, options.fuse);
  return h;
}

void Head::check_file() const {
  if (device_->reads_host_weights()) file_->check_unchanged();
}

std::shared_ptr<HostBuffer> Head::run(const float* hidden, int t, float* out, std::vector<NodeTiming>* timings) {
  std::lock_guard<std::mutex> lock(mu_);
  check_file();
  const size_t need = (size_t)t * (size_t)spec_.vocab;
  std::shared_ptr<HostBuffer> buf;
  if (!out) {
    // A buffer is free when the pool holds its only reference: every view of
    // it is gone, and new references are only made here, under the lock.
    auto free_slot = pool_.end();
    for (auto it = pool_.begin(); it != pool_.end(); ++it) {
      if (it->use_count() != 1) continue;
      if ((*it)->count >= need) {
        free_slot = it;
        break;
      }
      if (free_slot == pool_.end()) free_slot = it;
    }
    if (free_slot != pool_.end()) {
      // pairs with the release in the last view's decrement: its reads of the
      // old logits happen before this call's writes
      std::atomic_thread_fence(std::memory_order_acquire);
      if ((*free_slot)->count < need) {
        free_slot->reset();  // free the small one before allocating the larger
        *free_slot = device_->alloc_host(need);
      }
      buf = *free_slot;
    } else {
      buf = device_->alloc_host(need);
      if (pool_.size() < kPoolSize) pool_.push_back(buf);  // else a one-off, freed with its last view
    }
    last_ = buf;
    out = buf->data;
  }
  device_->run(hidden, t, out, timings);
  return buf;
}

bool Head::log_softmax_in_place(float* logits, int t) {
  std::lock_guard<std::mutex> lock(mu_);
  return device_->log_softmax_in_place(logits, t);
}

std::shared_ptr<HostBuffer> Head::buffer() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_.lock();
}

}  // namespace muser

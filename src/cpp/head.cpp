#include "head.h"

#include "cpu/parallel.h"
#include "errors.h"
#include "gguf.h"
#include "muser/dequant.h"

namespace muser {

namespace {

std::vector<float> vector_tensor(const GGUFFile& f, const std::string& name) {
  const GGUFTensorInfo* t = f.find_tensor(name);
  std::vector<float> out((size_t)t->nelements());
  dequant_row(t->type, f.tensor_data(*t), t->nelements(), out.data());
  return out;
}

}  // namespace

std::shared_ptr<Head> Head::load(const std::string& path, const HeadOptions& options) {
  return from_file(GGUFFile::open(path), options);
}

std::shared_ptr<Head> Head::from_file(std::shared_ptr<GGUFFile> file, const HeadOptions& options) {
  cpu::check_threads(options.threads);  // every device: the CUDA one takes it too
  std::shared_ptr<Head> h(new Head());
  h->file_ = std::move(file);
  h->options_ = options;
  h->spec_ = read_head_spec(*h->file_, options.overrides);
  const HeadSpec& s = h->spec_;
  const GGUFTensorInfo* w = h->file_->find_tensor(s.output_weight);
  if (options.acts == Acts::Q8 && (w->type == (uint32_t)GgmlType::F32 || w->type == (uint32_t)GgmlType::F16 ||
                                   w->type == (uint32_t)GgmlType::BF16))
    throw ArgValueError("acts='q8' needs a quantized head weight (Q8_0, Q4_K, Q5_K, Q6_K); '" + w->name +
                        "' is " + type_traits(w->type).name + " (use acts='f32')");
  h->weights_.output = {w->type, s.vocab, s.hidden, w->row_bytes(), h->file_->tensor_data(*w)};
  h->weights_.gamma = vector_tensor(*h->file_, s.norm_weight);
  if (!s.norm_bias.empty()) h->weights_.beta = vector_tensor(*h->file_, s.norm_bias);
  if (!s.output_bias.empty()) h->weights_.bias = vector_tensor(*h->file_, s.output_bias);
  h->nodes_ = build_route(options.route, s);
  h->device_ = make_device(options.device, options.threads);
  h->device_->prepare(s, h->weights_);
  return h;
}

std::shared_ptr<HostBuffer> Head::run(const float* hidden, int t, float* out, std::vector<NodeTiming>* timings) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t need = (size_t)t * (size_t)spec_.vocab;
  std::shared_ptr<HostBuffer> buf;
  if (!out) {
    if (!buffer_ || buffer_->count < need) buffer_ = device_->alloc_host(need);
    buf = buffer_;
    out = buf->data;
  }
  device_->run(nodes_, options_.acts, hidden, t, out, timings);
  return buf;
}

std::shared_ptr<HostBuffer> Head::buffer() const {
  std::lock_guard<std::mutex> lock(mu_);
  return buffer_;
}

}  // namespace muser

// RAII owners of CUDA resources (see memory.h). Destructors ignore release errors: by then the
// context may already be torn down (process exit), and there is no caller to hand an error to.
#include "lib/util/str_format.h"
#include "backends/cuda/memory.h"

#include <cuda.h>

#include <atomic>

#include "backends/cuda/cuda_status.h"

namespace strata::cuda {
namespace {

std::atomic<uint64_t> g_allocations{0};

}  // namespace

uint64_t AllocationCount() { return g_allocations.load(std::memory_order_relaxed); }

DeviceBuffer &DeviceBuffer::operator=(DeviceBuffer &&o) noexcept {
  if (this != &o) {
    Reset();
    ptr_ = std::exchange(o.ptr_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  DeviceBuffer b;
  if (bytes == 0) return b;
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  const cudaError_t err = cudaMalloc(&b.ptr_, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();  // an allocation failure is not sticky; clear it for later calls
    b.ptr_ = nullptr;
    return Annotate(CudaStatus(err, "cudaMalloc", __FILE__, __LINE__),
                    strata::StrFormat("allocating %u bytes of device memory", bytes));
  }
  b.size_ = bytes;
  return b;
}

void DeviceBuffer::Reset() {
  if (ptr_ != nullptr) cudaFree(ptr_);
  ptr_ = nullptr;
  size_ = 0;
}

PinnedBuffer &PinnedBuffer::operator=(PinnedBuffer &&o) noexcept {
  if (this != &o) {
    Reset();
    ptr_ = std::exchange(o.ptr_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

absl::StatusOr<PinnedBuffer> PinnedBuffer::Allocate(size_t bytes, unsigned flags) {
  PinnedBuffer b;
  if (bytes == 0) return b;
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  const cudaError_t err = cudaHostAlloc(&b.ptr_, bytes, flags);
  if (err != cudaSuccess) {
    cudaGetLastError();
    b.ptr_ = nullptr;
    return Annotate(CudaStatus(err, "cudaHostAlloc", __FILE__, __LINE__),
                    strata::StrFormat("allocating %u bytes of pinned host memory", bytes));
  }
  b.size_ = bytes;
  return b;
}

absl::StatusOr<void *> PinnedBuffer::DeviceAddress() const {
  void *d = nullptr;
  STRATA_CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&d, ptr_, 0));
  return d;
}

void PinnedBuffer::Reset() {
  if (ptr_ != nullptr) cudaFreeHost(ptr_);
  ptr_ = nullptr;
  size_ = 0;
}

Stream &Stream::operator=(Stream &&o) noexcept {
  if (this != &o) {
    Reset();
    s_ = std::exchange(o.s_, nullptr);
  }
  return *this;
}

absl::StatusOr<Stream> Stream::Create(bool non_blocking) {
  Stream s;
  STRATA_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&s.s_, non_blocking ? cudaStreamNonBlocking : cudaStreamDefault));
  return s;
}

absl::Status Stream::Synchronize() const {
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s_));
  return absl::OkStatus();
}

absl::Status Stream::Wait(cudaEvent_t event) const {
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(s_, event, 0));
  return absl::OkStatus();
}

void Stream::Reset() {
  if (s_ != nullptr) cudaStreamDestroy(s_);
  s_ = nullptr;
}

Event &Event::operator=(Event &&o) noexcept {
  if (this != &o) {
    Reset();
    e_ = std::exchange(o.e_, nullptr);
  }
  return *this;
}

absl::StatusOr<Event> Event::Create(bool timing) {
  Event e;
  STRATA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e.e_, timing ? cudaEventDefault : cudaEventDisableTiming));
  return e;
}

absl::Status Event::Record(cudaStream_t stream) const {
  STRATA_CUDA_RETURN_IF_ERROR(cudaEventRecord(e_, stream));
  return absl::OkStatus();
}

absl::Status Event::Synchronize() const {
  STRATA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(e_));
  return absl::OkStatus();
}

absl::StatusOr<bool> Event::Done() const {
  const cudaError_t e = cudaEventQuery(e_);
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: clear it
    return false;
  }
  STRATA_CUDA_RETURN_IF_ERROR(e);
  return true;
}

absl::StatusOr<float> Event::ElapsedMs(const Event &start, const Event &end) {
  float ms = 0.f;
  STRATA_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start.e_, end.e_));
  return ms;
}

void Event::Reset() {
  if (e_ != nullptr) cudaEventDestroy(e_);
  e_ = nullptr;
}

Graph &Graph::operator=(Graph &&o) noexcept {
  if (this != &o) {
    Reset();
    exec_ = std::exchange(o.exec_, nullptr);
  }
  return *this;
}

absl::Status Graph::BeginCapture(cudaStream_t stream) {
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  return absl::OkStatus();
}

absl::StatusOr<Graph> Graph::EndCapture(cudaStream_t stream, size_t *nodes) {
  cudaGraph_t graph = nullptr;
  const cudaError_t e = cudaStreamEndCapture(stream, &graph);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (graph != nullptr) cudaGraphDestroy(graph);
    return CudaStatus(e, "cudaStreamEndCapture", __FILE__, __LINE__);
  }
  if (nodes != nullptr && cudaGraphGetNodes(graph, nullptr, nodes) != cudaSuccess) *nodes = 0;
  Graph g;
  const cudaError_t ie = cudaGraphInstantiate(&g.exec_, graph, 0);
  cudaGraphDestroy(graph);
  if (ie != cudaSuccess) {
    (void)cudaGetLastError();
    g.exec_ = nullptr;
    return CudaStatus(ie, "cudaGraphInstantiate", __FILE__, __LINE__);
  }
  return g;
}

absl::Status Graph::Launch(cudaStream_t stream) const {
  STRATA_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec_, stream));
  return absl::OkStatus();
}

void Graph::Reset() {
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  exec_ = nullptr;
}

absl::Status CopyAsync(void *dst, const void *src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return absl::OkStatus();
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
  return absl::OkStatus();
}

absl::Status CopyBatchAsync(void *const *dsts, const void *const *srcs, const size_t *sizes, size_t n,
                            cudaStream_t stream, bool *batch) {
  if (n == 0) return absl::OkStatus();
#if CUDART_VERSION >= 12080
  if (*batch) {
    cudaMemcpyAttributes a{};
    a.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t at = 0;
    if (cudaMemcpyBatchAsync(const_cast<void **>(dsts), const_cast<const void **>(srcs), const_cast<size_t *>(sizes),
                             n, &a, &at, 1, stream) == cudaSuccess) {
      return absl::OkStatus();
    }
    (void)cudaGetLastError();  // a driver older than the runtime, or one refusing the batch
    *batch = false;
  }
#else
  *batch = false;
#endif
  for (size_t i = 0; i < n; ++i) {
    STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyHostToDevice, stream));
  }
  return absl::OkStatus();
}

bool StreamWriteValue32(uint32_t *dst, uint32_t value, cudaStream_t stream) {
#if CUDART_VERSION < 12050  // no versioned entry points: the caller copies
  (void)dst;
  (void)value;
  (void)stream;
  return false;
#else
  using WriteValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
  static const WriteValue32 write = [] {
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<WriteValue32>(fn);
  }();
  return write != nullptr && write(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(dst), value,
                                   CU_STREAM_WRITE_VALUE_DEFAULT) == CUDA_SUCCESS;
#endif
}

}  // namespace strata::cuda

#pragma once
// The CUDA executor behind the model_runner interface. This header needs no
// CUDA headers: the CLI and the executor actor include it whether or not the
// build has CUDA (without it, cuda_device_count() is 0 and make_cuda_runner
// throws).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/dtype.hpp"
#include "model/engine_limits.hpp"
#include "model/model_runner.hpp"

namespace metronome {

struct model_folder;

namespace gpu {
class collective;
}

/// Settings of one CUDA runner.
struct cuda_runner_options {
  /// CUDA device ordinal ("cuda:N").
  int device = 0;
  /// Share of the device's memory the runner may hold in all (weights,
  /// activations, graphs, KV pool).
  double gpu_memory_fraction = 0.9;
  /// Replicas of this process that share the device (data parallel, each
  /// given gpu_memory_fraction / device_replicas). Above 1 the runner's
  /// plan counts only the memory it allocated itself since it started, not
  /// the other replicas' (which "total - free" would include).
  int32_t device_replicas = 1;
  /// Most sequences and tokens in one step (decode graphs are captured up
  /// to max_batch_size), tokens per KV page, the KV pool's size in tokens
  /// (0 = whatever the memory plan leaves), the longest sequence (0 = the
  /// model's max_position_embeddings, capped by the KV pool), and the step
  /// timeout: the longest any wait for the device may take (a step, the
  /// start-up's own device work, the shutdown's) before the runner gives up
  /// on the device, so a hung kernel becomes an exception, never an endless
  /// wait. max_queued_requests is the scheduler's.
  engine_limits limits;
  /// Capture decode steps as CUDA graphs (one per padded batch size), and
  /// steps with small prompt chunks beside decodes (mixed_graphs).
  bool cuda_graphs = true;
  /// With cuda_graphs: also capture steps that carry prompt chunks of up to
  /// 256 tokens in all beside their decodes (padded to a grid of sizes).
  bool mixed_graphs = true;
  /// Element type of the KV cache; fp8 (e4m3 bytes with one float scale per
  /// token row of each kv head) halves the bytes a decode step reads (about
  /// 3% more than half at head_dim 128, for the scales); so does fp8_e5m2
  /// (e5m2 bytes, a scale per window of 256 positions: gpu/kv_e5m2.cuh),
  /// whose values past a window's range are counted in
  /// step_output::kv_overflows. A sequence a plan marks kv_precision::full
  /// is refused (plan_error): full-precision pages beside fp8 ones are not
  /// built on CUDA. One the model or
  /// the kernels cannot use (cuda_kv_cache_problem): make_cuda_runner throws
  /// std::invalid_argument.
  kv_cache_dtype_kind kv_cache_dtype = kv_cache_dtype_kind::bf16;
  /// Sequences the runner can hold at once (admitted and not yet released);
  /// 0 = 4 x limits.max_batch_size.
  int32_t max_seqs = 0;
  /// Decode projections per captured batch size: "auto" times the fused GEMV
  /// (up to 8 sequences), the tensor-core skinny GEMM (up to 64) and cuBLAS
  /// at start-up and keeps the fastest; "gemv", "skinny" or "cublas" force
  /// one where it applies (cuBLAS beyond).
  std::string small_batch_path = "auto";
  /// Spatial sharing (gpu/sm_partition.hpp): 0 runs on every SM of the
  /// device. Otherwise the runner's stream lives in a green context of the
  /// device's first sm_count SMs (rounded up to its granularity, 8 on
  /// sm_90), or with sm_rest of the SMs left after them, and its one-wave
  /// kernels, split choices and cuBLAS size themselves to that share; two
  /// runners given complementary shares do not take SMs from each other.
  /// Used by `gpu_bench --overlap`; the server does not set it yet.
  int32_t sm_count = 0;
  bool sm_rest = false;
  /// Tensor parallelism (model/tensor_parallel.hpp, gpu/collective.hpp):
  /// with N > 1, make_cuda_runner starts one runner per rank, rank r on
  /// tensor_parallel_devices[r] (empty: device + r; a device listed k times
  /// holds k ranks, each with gpu_memory_fraction / k), each serving its
  /// shard of the model, and returns a runner that drives them in step.
  int32_t tensor_parallel = 1;
  std::vector<int> tensor_parallel_devices;
  /// "auto" (peer when every rank is on one device, else nccl), "nccl" or
  /// "peer".
  std::string tensor_parallel_collective = "auto";
  /// Set by make_cuda_runner on each rank's own options: its endpoint of the
  /// group (null: no tensor parallelism, the engine runs alone).
  std::shared_ptr<gpu::collective> collective;
  /// Benchmarks only: a decode batch size whose captured step is replayed
  /// once more inside a profiler range at start-up (for `ncu
  /// --profile-from-start off`, tools/ncu_step_profile.py); 0 = none.
  int32_t profile_batch = 0;
};

/// Number of CUDA devices; 0 when there is no GPU, no driver or no CUDA in
/// this build (GPU tests skip then).
int cuda_device_count();

/// Why CUDA device `device` (an ordinal) cannot be used here, or "" if it
/// can: no device at all, or fewer devices than the ordinal needs. The
/// server asks it before any executor starts and make_cuda_runner asks it
/// again, so a missing device is one clear error, never restarts. Any
/// thread.
std::string cuda_device_problem(int device);

/// Loads `model` onto the device, plans its memory, captures the decode
/// graphs and returns the runner. Call it on the thread that will call
/// execute(): the runner is used by that one thread only. Throws
/// std::runtime_error (cuda_error) with the failing CUDA call and its site,
/// or std::invalid_argument for a model or option the runner cannot serve.
/// 4-bit checkpoints (GPTQ, AWQ) are served in 4 bits where the kernels take
/// them (gpu/weight_store.hpp), else as their exact bf16 dequantization.
/// Calls for one device run one at a time (a replica's memory plan measures
/// its own start-up); calls for different devices run in parallel.
std::unique_ptr<model_runner> make_cuda_runner(std::shared_ptr<const model_folder> model,
                                               const cuda_runner_options& options);

/// Parses "cuda", "cuda:N" into N; nullopt-like -1 for anything else.
int parse_cuda_device(const std::string& device);

/// Turns graph replay of a CUDA runner on or off (benchmarks compare both);
/// returns false when `runner` is not a CUDA runner.
bool set_cuda_graphs(model_runner& runner, bool enabled);

/// Turns replay of the mixed-step graphs on or off (benchmarks, tests);
/// false when `runner` is not a CUDA runner.
bool set_mixed_graphs(model_runner& runner, bool enabled);

/// Steps of a CUDA runner that replayed a mixed-step graph; -1 for another
/// runner.
int64_t cuda_mixed_graph_launches(const model_runner& runner);

/// Device time per decode step of the captured graph for `batch` sequences,
/// replayed back to back: the step without the host's share (plan packing,
/// launch, the wait for ids). On padding inputs (a context of one token), or
/// with repeat_last_step on the last step's own inputs (its contexts; the
/// step is idempotent, so running sequences are unaffected). NaN when
/// `runner` is not a CUDA runner, no graph serves that size, or (with
/// repeat_last_step) the last step did not replay that graph. Synchronous;
/// call between steps on the runner's thread.
double cuda_graph_replay_ms(model_runner& runner, int32_t batch, bool repeat_last_step = false);

/// A line on the runner's start-up choices (which path small decode batches
/// take); empty when `runner` is not a CUDA runner.
std::string describe_cuda_runner(const model_runner& runner);

/// For tests: the logits of the last step's first `rows` sampled sequences
/// ([rows][vocab], after penalties; scaled by 1/temperature where sampled
/// with a temperature). Synchronises with the device.
std::vector<float> cuda_runner_logits(model_runner& runner, int32_t rows);

/// Why the CUDA runner cannot keep `config`'s KV cache as `dtype` ("" when it
/// can): fp8 and fp8_e5m2 need head_dim 16, 32, 64 or 128, at most 8 query
/// heads a kv head and the second-generation attention kernels. Host arithmetic, no
/// device: spawn_engine asks before any executor starts, the runner again
/// when it starts. Any thread.
std::string cuda_kv_cache_problem(const model_config& config, kv_cache_dtype_kind dtype);

/// The memory plan as a few lines of text, for logs and start-up output.
std::string format_memory_plan(const std::vector<memory_plan_entry>& plan);

} // namespace metronome

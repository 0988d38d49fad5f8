// Hybrid placement: where a routed expert that is not in the device's memory runs. The device can
// read it from page-locked host RAM over the link (PCIe) as its kernels run, or the CPU can compute
// it where it lies and send back one row per token. Both go on at once, so a layer's cold experts
// are split between them to end together: the CPU takes those it is cheapest for (fewest tokens),
// until adding one more would make it the later of the two.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace strata::model {

// Measured rates of the two ways to run a cold expert.
struct PlacementRates {
  double link_bytes_s = 0;     // bytes/s the device reads host memory at (0: the link is not used)
  double cpu_bytes_s = 0;      // expert bytes/s the CPU computes one token over (0: no CPU compute)
  // Extra CPU time of each further token of an expert, as a share of the one-token time: a CPU
  // expert of t tokens costs bytes / cpu_bytes_s * (1 + cpu_token_share * (t - 1)).
  double cpu_token_share = 0;
  double cpu_fixed_s = 0;      // a CPU job's start and return (host round trip), paid once a layer
  // The link side's own latency in a layer that leaves it an expert, beyond its bytes: a copier's
  // reaction to the request, the products after the last copy lands. Paid once a layer.
  double link_fixed_s = 0;
};

// A routed expert a layer selected that is not in device memory.
struct ColdExpert {
  int expert = 0;
  int64_t tokens = 0;  // tokens of the batch routed to it
  uint64_t bytes = 0;  // its gate, up and down bytes
};

// Seconds the link takes for e: the device's grouped kernels read an expert's weights once per
// chunk of up to 8 of its tokens.
double LinkSeconds(const ColdExpert &e, const PlacementRates &r);
double CpuSeconds(const ColdExpert &e, const PlacementRates &r);

// The experts (ids, ascending) the CPU computes: cold experts in order of CPU over link time (ties to
// the lower id) are moved to the CPU while that lowers the later of the CPU's time (cpu_fixed_s
// plus its experts) and the link's (link_fixed_s plus the rest, 0 when none is left).
// Deterministic for given inputs.
std::vector<int> ChooseCpuExperts(std::vector<ColdExpert> cold, const PlacementRates &r);

// The CPU's cost of a job, fitted online: seconds = fixed + x / rate, x the job's one-token-
// equivalent bytes (sum of bytes (1 + cpu_token_share (t - 1))), by least squares over the jobs
// seen, older ones weighing less (each new job multiplies the old weights by `decay`). While the
// jobs' sizes barely vary the terms cannot be told apart: the rate is then fitted through the last
// fixed cost (0 at first).
class CpuCostFit {
 public:
  explicit CpuCostFit(double decay = 0.98) : decay_(decay) {}
  void Add(double x, double secs);
  // From now on the fixed cost stays as fitted and samples move the rate alone: decode's jobs are
  // mostly of one or two experts, too alike in size to keep the two terms apart. A job faster
  // than the held fixed cost lowers it to half that job's time.
  void HoldFixed() { hold_ = true; }
  double rate() const { return rate_; }    // bytes/s; 0 until fitted
  double fixed() const { return fixed_; }  // seconds

 private:
  double decay_, w_ = 0, x_ = 0, y_ = 0, xx_ = 0, xy_ = 0;
  double rate_ = 0, fixed_ = 0;
  bool hold_ = false;
};

// The n entries of `heat` that should hold the tier's slots: the hottest first (ties to the lower
// index), only entries with heat > 0.
std::vector<size_t> HottestExperts(const std::vector<uint32_t> &heat, size_t n);

// Whether an expert used `hot` times should take the slot of one used `cold` times: only when the
// difference is beyond what chance gives two experts of the same popularity (counts as Poisson
// draws: hot - cold > z sqrt(hot + cold)), so that the tier does not trade experts over noise
// (with even routing a 512-token prompt gives every expert ~32 +- 6 uses).
bool MarkedlyHotter(uint32_t hot, uint32_t cold, double z = 2.0);

// Seconds a layer saves per call by splitting `cold_bytes` of one-token experts (each of
// `expert_bytes`) between the link and the CPU, against the link alone; <= 0 when it does not pay.
double HybridSavingSeconds(double cold_bytes, uint64_t expert_bytes, const PlacementRates &r);

// Where a tier can copy its cold experts into device memory by the copy engines while the layers
// compute, the CPU's share (ChooseCpuExperts, beside in-place reads) is a second way to serve them
// rather than a saving on the link alone: the copies overlap the compute around them, which no
// per-expert rate captures. So the two are timed, per batch size (a step's token count): `samples`
// steps with every cold expert over the link (kLink), then as many with the cost model's CPU share
// (kHybrid), the first `settle` steps after each switch untimed (the paths change, a graph is
// recorded). The faster by median step time is that size's verdict for the next `hold` steps (of
// any size), after which the size is timed again. Within `margin` of kLink, kHybrid (the cost
// model's choice) is kept: four steps a way cannot tell such times apart, and with spread routing
// the cost model alone decoded faster than probes that called such a tie for kLink
// (bench/README.md). A probe of kHybrid ends early once its first two steps are both slower
// than kLink by a tenth. A step of another size ends a probe: a size with a verdict runs it, one
// without starts its own probe (with kLink), so a batch whose size changes before a probe ends
// stays on kLink, and batches moving between sizes already timed (sessions joining and leaving)
// keep each size's verdict.
class RegimeProbe {
 public:
  enum class Regime { kLink, kHybrid };
  struct Options {
    int settle = 2;
    int samples = 4;
    int64_t hold = 1024;
    double margin = 0.03;
    int max_resettles = 4;  // Disturbed steps kept out of a phase's samples
    size_t max_sizes = 64;  // verdicts kept (the oldest goes first)
  };
  RegimeProbe() : RegimeProbe(Options{}) {}
  explicit RegimeProbe(const Options &o) : o_(o) {}

  // At the start of a step of `n_tok` tokens, `now_s` seconds on a monotonic clock: the regime the
  // step runs. The time since the previous call is the previous step's.
  Regime Step(int64_t n_tok, double now_s);
  // The step Step just returned for changes its paths (a layer joins or leaves the CPU's share as
  // the fitted rates move, its graph is recorded again): that step and the next are not samples,
  // as after a switch. At most Options::max_resettles times a phase, so paths that keep changing
  // cannot hold a probe open; the samples after that count as they come.
  void Disturbed();
  // The step Step just returned kHybrid for ran on the link after all: the backend held the CPU
  // share's entry (the cost model's saving did not outweigh recording the step). It is no sample,
  // and the phase starts again at the step that does enter. A probe of kHybrid declined
  // Options::settle + Options::samples times ends on kLink: the share was never timed, so it is
  // not let in untimed later (the next probe, after `hold` steps, asks again).
  void Declined();

  Regime held() const { return held_; }  // the verdict of the last finished probe
  double link_s() const { return link_s_; }      // its median step times (0: not measured)
  double hybrid_s() const { return hybrid_s_; }
  int probes() const { return probes_; }          // probes finished
  int64_t resettles() const { return resettles_total_; }  // steps Disturbed kept out of the samples
  int64_t declines() const { return declined_total_; }     // steps Declined kept out of the samples

 private:
  enum class Phase { kNone, kLink, kHybrid };
  struct Verdict {
    Regime regime;
    int64_t at;  // the step it was reached
  };
  void Restart(int64_t n_tok);
  void Finish(Regime r);

  Options o_;
  Phase phase_ = Phase::kNone;  // the probe in progress (kNone: none)
  int64_t shape_ = -1;          // its batch size
  int64_t steps_ = 0;           // its steps in this phase
  std::vector<double> times_;
  std::map<int64_t, Verdict> verdicts_;
  int64_t step_ = 0;  // steps seen
  Regime held_ = Regime::kLink;
  double link_s_ = 0, hybrid_s_ = 0;
  int probes_ = 0;
  int resettles_ = 0;  // in this phase
  int declined_ = 0;   // in this phase
  int64_t resettles_total_ = 0;
  int64_t declined_total_ = 0;
  bool have_last_ = false;
  double last_t_ = 0;
};

}  // namespace strata::model

// bench_common.h: what fa-bench and mm-bench share (tuner/data/fa_bench.cpp, tuner/data/mm_bench.cpp): the
// command line, the backend, a graph that cycles through the copies of an op, and its timed run with the
// tail of the case's output line. Header-only: each program is one file compiled with this beside it
// (tuner/measure/fa_bench.py build_bench), using ggml's public API only.

#pragma once

#include "ggml-backend.h"
#include "ggml.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace bench {

// the program's name in its messages ("fa-bench", "mm-bench"); set first thing in main
inline const char * prog = "bench";

[[noreturn]] inline void usage(const std::string & why) {
    std::fprintf(stderr,
                 "%s: %s\n"
                 "usage: %s -b BACKEND -f CASES [-n ITERS] [-c CACHE_MB] [-t THREADS] [-w WARMUP_RUNS] [-m TARGET_MS]\n"
                 "       [-T CASE_SECONDS]\n",
                 prog, why.c_str(), prog);
    std::exit(2);
}

inline int64_t parse_int(const char * s, const char * what, int64_t lo, int64_t hi) {
    char * end = nullptr;
    const long long v = std::strtoll(s, &end, 10);
    if (end == s || *end != '\0' || v < lo || v > hi) {
        usage(std::string(what) + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
              "] (got '" + s + "')");
    }
    return v;
}

struct args {
    std::string backend_name;
    std::string cases_path;
    int64_t iters = 50;
    int64_t cache_mb = 128;
    int64_t threads = std::max<int64_t>(1, int64_t(std::thread::hardware_concurrency()) / 2);
    // -w: untimed runs of a case's graph before the timed one. Two, so that on a CUDA build with graphs
    // (GGML_CUDA_USE_GRAPHS, llama.cpp's default) the timed run replays a captured CUDA graph, as a model's
    // repeated graphs do: ggml_backend_cuda_graph_compute (ggml/src/ggml-cuda/ggml-cuda.cu) runs a new graph
    // directly on its first call, captures and instantiates it on the second (the first with the same node
    // properties) and only replays it from the third; with one warm-up the timed run was the capture.
    int64_t warmup = 2;
    int64_t case_timeout = 0;  // -T: seconds one case may take before the program exits 124 (0: no limit)
    int64_t target_ms = 0;     // -m: time at least this many ms of ops per case (0: -n ops); time_case
};

// the most ops -m makes a case time (a power of two, so on the half-octave series of calibrated_ops): an op
// of 1.2 us or more still reaches a 20 ms target, and a graph stays small enough to capture in milliseconds
inline constexpr int64_t max_ops = 16384;

// -b BACKEND -f CASES [-n ITERS] [-c CACHE_MB] [-t THREADS] [-w WARMUP_RUNS] [-m TARGET_MS] [-T CASE_SECONDS];
// bad ones: usage (exit 2)
inline args parse_args(int argc, char ** argv) {
    args a;
    for (int i = 1; i < argc; i++) {
        const std::string opt = argv[i];
        if (i + 1 >= argc) {
            usage("option " + opt + " needs a value");
        }
        const char * val = argv[++i];
        if (opt == "-b") {
            a.backend_name = val;
        } else if (opt == "-f") {
            a.cases_path = val;
        } else if (opt == "-n") {
            a.iters = parse_int(val, "-n", 1, 1000000);
        } else if (opt == "-c") {
            a.cache_mb = parse_int(val, "-c", 0, 1 << 20);
        } else if (opt == "-t") {
            a.threads = parse_int(val, "-t", 1, 4096);
        } else if (opt == "-w") {
            a.warmup = parse_int(val, "-w", 0, 1000);
        } else if (opt == "-m") {
            a.target_ms = parse_int(val, "-m", 0, 60000);
        } else if (opt == "-T") {
            a.case_timeout = parse_int(val, "-T", 0, 86400);
        } else {
            usage("unknown option " + opt);
        }
    }
    if (a.backend_name.empty() || a.cases_path.empty()) {
        usage("-b BACKEND and -f CASES are required");
    }
    return a;
}

// the backend named -b (usage, with the names this build has, when there is none), with -t threads where
// it takes a thread count; prints the run's header line
inline ggml_backend_t init_backend(const args & a) {
    ggml_time_init();
    ggml_backend_load_all();
    ggml_backend_t backend = ggml_backend_init_by_name(a.backend_name.c_str(), nullptr);
    if (backend == nullptr) {
        std::string names;
        for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
            names += std::string(i ? ", " : "") + ggml_backend_dev_name(ggml_backend_dev_get(i));
        }
        usage("no backend named " + a.backend_name + " (this build has: " + names + ")");
    }
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    if (dev != nullptr) {
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
        auto set_threads =
            (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads");
        if (set_threads != nullptr) {
            set_threads(backend, int(a.threads));
        }
    }
    std::printf("%s backend=%s iters=%lld cache_mb=%lld warmup=%lld target_ms=%lld\n", prog,
                ggml_backend_name(backend), (long long) a.iters, (long long) a.cache_mb, (long long) a.warmup,
                (long long) a.target_ms);
    std::fflush(stdout);
    return backend;
}

// -T: a case that hangs (a stuck kernel or library call) ends the program with exit code 124 instead of
// holding the whole run; the caller fails that case and runs the rest in a new process. alarm() and a
// handler that only write()s and _exit()s are async-signal-safe.
inline void on_case_timeout(int) {
    static const char msg[] = "case timed out (-T): abandoned\n";
    (void) !write(2, msg, sizeof(msg) - 1);
    _exit(124);
}

// call before each case with -T's value (0: no limit), and with 0 after it
inline void case_deadline(int64_t seconds) {
    std::signal(SIGALRM, on_case_timeout);
    alarm(static_cast<unsigned>(seconds));
}

// t filled with data repeated (a pool of random rows uploaded again and again: a large tensor costs an
// upload, not a random draw and a conversion per value)
inline void fill_repeating(ggml_tensor * t, const std::vector<uint8_t> & data) {
    const size_t n = ggml_nbytes(t);
    for (size_t off = 0; off < n; off += data.size()) {
        ggml_backend_tensor_set(t, data.data(), off, std::min(data.size(), n - off));
    }
}

// one graph of n_ops ops in a context of its own (*gctx; ggml_free it): each copy's output once (with the
// nodes_per_copy tensors it is built from), then again cycling through the copies. nullptr if ggml_init fails.
inline ggml_cgraph * cycle_graph(ggml_context ** gctx, const std::vector<ggml_tensor *> & outs, size_t nodes_per_copy,
                                 int64_t n_ops) {
    const size_t graph_size = size_t(n_ops) + outs.size() * nodes_per_copy + 16;
    ggml_init_params params = {
        /*.mem_size   =*/ggml_graph_overhead_custom(graph_size, false),
        /*.mem_buffer =*/nullptr,
        /*.no_alloc   =*/true,
    };
    *gctx = ggml_init(params);
    if (*gctx == nullptr) {
        return nullptr;
    }
    ggml_cgraph * gf = ggml_new_graph_custom(*gctx, graph_size, false);
    for (ggml_tensor * out : outs) {
        ggml_build_forward_expand(gf, out);
    }
    const int64_t copies = int64_t(outs.size());
    for (int64_t i = copies; i < n_ops; i++) {
        ggml_graph_add_node(gf, outs[size_t(i % copies)]);
    }
    return gf;
}

// the smallest of 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (2^k and 3 * 2^k) that is at least n
inline int64_t half_octave_ceil(int64_t n) {
    for (int64_t v = 1;; v *= 2) {
        if (v >= n) {
            return v;
        }
        if (v >= 2 && v + v / 2 >= n) {
            return v + v / 2;
        }
    }
}

// -m: the ops a case times so that its timed run lasts at least target_us, from a timed run of n_min ops
// that took run_us: the ops the target needs at that rate, rounded up to the half-octave series (so the
// processes of a paired comparison, whose calibrations differ by noise, mostly time the same count; one
// step apart where they do not, which changes the count, not the mean per op), at least n_min, at most
// max_ops. A run that already lasts the target keeps its n_min ops.
inline int64_t calibrated_ops(int64_t n_min, double run_us, int64_t target_us) {
    if (target_us <= 0 || run_us >= double(target_us)) {
        return n_min;
    }
    const double per_op = run_us / double(n_min);
    const double need = per_op > 0 ? std::ceil(double(target_us) / per_op) : double(max_ops);
    return std::max(n_min, half_octave_ceil(int64_t(std::min(need, double(max_ops)))));
}

// how a case is timed: -n, -w and -m
struct timing {
    int64_t iters;      // the fewest ops timed (at least one per copy as well)
    int64_t warmup;     // untimed runs of each graph before its timed run
    int64_t target_us;  // the timed run's least duration (0: iters ops, no calibration)
};

// warm-up runs, then one timed run (microseconds, or -1 where a run failed)
inline double run_graph(ggml_backend_t backend, ggml_cgraph * gf, int64_t warmup) {
    for (int64_t w = 0; w < warmup; w++) {
        if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {
            return -1;
        }
    }
    ggml_backend_synchronize(backend);
    const int64_t t0 = ggml_time_us();
    const ggml_status status = ggml_backend_graph_compute(backend, gf);
    ggml_backend_synchronize(backend);
    const int64_t t1 = ggml_time_us();
    return status == GGML_STATUS_SUCCESS ? double(t1 - t0) : -1;
}

// time a case whose copies' outputs are outs (each built from nodes_per_copy tensors): a graph of
// max(iters, copies) ops, its warm-up runs, then its timed run. With a target (-m), the graph's first run,
// which is one of its warm-ups anyway, is timed as the calibration: where it was shorter than the target, a
// graph of calibrated_ops() ops replaces it and is warmed up and timed (a new graph: on CUDA it runs directly,
// then is captured, then replayed); where it was not, the same graph's other warm-ups and its timed run
// follow. A first run is never a CUDA graph replay (ggml_backend_cuda_graph_compute runs a new graph
// directly), so it overstates the time of an op somewhat, and the count it gives can fall short of the
// target by that much; the capture and the second warm-up of the short graph are no longer run, which
// saves two runs of it a case. print_case() prints the line's head, this its tail: copies=C copy_bytes=B
// ops=N us_per_op=T, or error=WHY.
template <class PrintCase>
void time_case(ggml_backend_t backend, const std::vector<ggml_tensor *> & outs, size_t nodes_per_copy,
               size_t copy_bytes, const timing & tm, PrintCase print_case) {
    const int64_t copies = int64_t(outs.size());
    int64_t n_ops = std::max<int64_t>(tm.iters, copies);
    ggml_context * gctx = nullptr;
    ggml_cgraph * gf = cycle_graph(&gctx, outs, nodes_per_copy, n_ops);
    double us = -1;
    if (gf != nullptr && tm.target_us > 0) {
        const double first = run_graph(backend, gf, 0);  // the calibration: the first of the warm-ups, timed
        const int64_t n_target = first < 0 ? n_ops : calibrated_ops(n_ops, first, tm.target_us);
        if (first < 0) {
            us = -1;
        } else if (n_target > n_ops) {
            ggml_free(gctx);
            n_ops = n_target;
            gf = cycle_graph(&gctx, outs, nodes_per_copy, n_ops);
            us = gf == nullptr ? -1 : run_graph(backend, gf, tm.warmup);
        } else {
            us = run_graph(backend, gf, std::max<int64_t>(tm.warmup - 1, 0));
        }
    } else if (gf != nullptr) {
        us = run_graph(backend, gf, tm.warmup);
    }
    print_case();
    if (gf == nullptr) {
        std::printf(" copies=%lld copy_bytes=%zu error=ggml_init failed (graph)\n", (long long) copies, copy_bytes);
    } else if (us < 0) {
        std::printf(" copies=%lld copy_bytes=%zu error=graph compute failed\n", (long long) copies, copy_bytes);
    } else {
        std::printf(" copies=%lld copy_bytes=%zu ops=%lld us_per_op=%.3f\n", (long long) copies, copy_bytes,
                    (long long) n_ops, us / double(n_ops));
    }
    std::fflush(stdout);
    if (gctx != nullptr) {
        ggml_free(gctx);
    }
}

// a program's main: the command line, its cases (read_cases; usage when there are none), the backend,
// then run_case on each case in turn under -T's deadline
template <typename Case, typename ReadCases, typename RunCase>
int main_loop(int argc, char ** argv, const char * name, ReadCases read_cases, RunCase run_case) {
    prog = name;
    const args a = parse_args(argc, argv);
    const std::vector<Case> cases = read_cases(a.cases_path);
    if (cases.empty()) {
        usage("no cases in " + a.cases_path);
    }
    ggml_backend_t backend = init_backend(a);
    for (size_t i = 0; i < cases.size(); i++) {
        case_deadline(a.case_timeout);
        const int64_t t0 = ggml_time_us();
        run_case(backend, i, cases[i], timing{a.iters, a.warmup, a.target_ms * 1000}, a.cache_mb << 20);
        case_deadline(0);
        // the case's whole wall time (allocation, upload, graph builds and every run): with ops and
        // us_per_op it splits a case's cost into setup and timing, which is what a sweep's budget is made of
        std::printf("wall case=%zu ms=%.1f\n", i, double(ggml_time_us() - t0) / 1000.0);
        std::fflush(stdout);
    }
    ggml_backend_free(backend);
    return 0;
}

}  // namespace bench

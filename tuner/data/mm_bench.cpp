// mm-bench: time ggml's MUL_MAT of quantized weights by F32 activations, reading cold weights on every op.
//
// Built by tuner (tuner/measure/mm_bench.py) against a llama.cpp build's ggml headers and shared
// libraries; it uses only ggml's public API (ggml.h, ggml-alloc.h, ggml-backend.h) and bench_common.h beside it
// (the command line, the backend and the timed run it shares with the other bench program).
//
// The op is the one llama.cpp's graph hands the backend for a dense projection (build_lora_mm):
// ggml_mul_mat(ctx, W, X) with
//   W: the weights, src0, of a quantized type [k, m] (k values a row, m rows), filled by quantizing
//      uniform random floats with ggml_quantize_chunk (an importance matrix of ones where the type needs one;
//      rows of a pool of about 2^20 values, repeated);
//   X: the activations, src1, F32 [k, ne11] (ne11 = the batch size), uniform random floats (rows of a pool
//      of about 2^20 values, repeated);
//   out: F32 [m, ne11].
// Which kernel the backend runs is not chosen here: the CUDA backend decides between MMQ and cuBLAS in
// ggml_cuda_should_use_mmq, which a tuner-patched mmq.cu lets GGML_TUNER_MMQ_CHOICES override
// (tuner/sweep/mmq.py), so the caller sets that environment variable and this program times the op.
//
// As fa-bench (tuner/data/fa_bench.cpp): each case allocates enough copies of W that together they exceed
// --cache-mb, and one graph runs the op --iters times (at least once per copy), cycling through the copies,
// so each op reads weights that the previous ones evicted from the cache, as a model's layers do. X is
// one tensor shared by every op (a layer's activations are fresh in the cache). Two warm-up runs of the
// graph (-w; on a CUDA build with graphs the second captures it: bench_common.h), then one timed run:
// the mean is the timed run's wall time (ggml_backend_graph_compute synchronizes) over its ops.
//
// Usage: mm-bench -b BACKEND -f CASES [-n ITERS] [-c CACHE_MB] [-t THREADS] [-w WARMUP_RUNS] [-m TARGET_MS]
//                 [-T CASE_SECONDS]
// -m: time at least TARGET_MS of ops per case, as fa-bench's -m (default 0: ITERS ops).
// -T: a case running longer ends the program with exit code 124 (default 0: no limit).
// CASES: one case a line, "type m k ne11" (type a quantized ggml type name such as q4_K; k a multiple of
// its block size); '#' starts a comment. Output: one line a case,
//   case=I type=.. m=.. k=.. ne11=.. copies=C copy_bytes=B ops=N us_per_op=T
// (copy_bytes: one copy of W) or the same up to ne11= followed by "error=WHY". Bad arguments (an unknown
// or unquantized type included): a message and exit code 2.

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "bench_common.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct mm_case {
    std::string type_name;
    int64_t m, k, ne11;
    ggml_type type;
};

ggml_type quantized_type(const std::string & name) {
    for (int t = 0; t < GGML_TYPE_COUNT; t++) {
        const char * tn = ggml_type_name(ggml_type(t));
        if (tn != nullptr && name == tn && ggml_is_quantized(ggml_type(t)) &&
            ggml_get_type_traits(ggml_type(t))->blck_size > 0) {
            return ggml_type(t);
        }
    }
    return GGML_TYPE_COUNT;
}

std::vector<mm_case> read_cases(const std::string & path) {
    std::ifstream in(path);
    if (!in) {
        bench::usage("cannot read the cases file " + path);
    }
    std::vector<mm_case> cases;
    std::string line;
    int lineno = 0;
    while (std::getline(in, line)) {
        lineno++;
        line = line.substr(0, line.find('#'));
        std::istringstream ss(line);
        mm_case c{};
        if (!(ss >> c.type_name)) {
            continue;  // blank or comment
        }
        std::string extra;
        const std::string where = path + ":" + std::to_string(lineno) + ": ";
        if (!(ss >> c.m >> c.k >> c.ne11) || (ss >> extra)) {
            bench::usage(where + "expected 'type m k ne11'");
        }
        c.type = quantized_type(c.type_name);
        if (c.type == GGML_TYPE_COUNT) {
            bench::usage(where + "type must be a quantized ggml type name such as q4_0 or q4_K (got " + c.type_name + ")");
        }
        const int64_t lim = int64_t(1) << 20;
        for (int64_t v : {c.m, c.k, c.ne11}) {
            if (v < 1 || v > lim) {
                bench::usage(where + "sizes must be in [1, 1048576]");
            }
        }
        if (c.k % ggml_blck_size(c.type) != 0) {
            bench::usage(where + "k must be a multiple of " + c.type_name + "'s block size " +
                  std::to_string(ggml_blck_size(c.type)));
        }
        cases.push_back(c);
    }
    return cases;
}

std::vector<float> random_floats(size_t n, std::mt19937 & gen) {
    std::uniform_real_distribution<float> dis(-1.0f, 1.0f);
    std::vector<float> out(n);
    for (float & x : out) {
        x = dis(gen);
    }
    return out;
}

// nrows rows of n_per_row random values quantized to type
std::vector<uint8_t> quantized_rows(ggml_type type, int64_t n_per_row, int64_t nrows, std::mt19937 & gen) {
    const std::vector<float> f32 = random_floats(size_t(n_per_row * nrows), gen);
    std::vector<uint8_t> out(ggml_row_size(type, n_per_row) * size_t(nrows));
    const std::vector<float> imatrix(size_t(n_per_row), 1.0f);
    const float * im = ggml_quantize_requires_imatrix(type) ? imatrix.data() : nullptr;
    ggml_quantize_chunk(type, f32.data(), out.data(), 0, nrows, n_per_row, im);
    return out;
}

// the quantized pool of W for (type, k), at least nrows rows (grown when a case needs more), made once
const std::vector<uint8_t> & weight_pool(ggml_type type, int64_t k, int64_t nrows) {
    static std::map<std::pair<int, int64_t>, std::vector<uint8_t>> pools;
    std::vector<uint8_t> & pool = pools[{int(type), k}];
    const size_t bytes = ggml_row_size(type, k) * size_t(nrows);
    if (pool.size() < bytes) {
        std::mt19937 gen(1234 + uint32_t(type) * 7919u + uint32_t(k));
        pool = quantized_rows(type, k, nrows, gen);
    }
    return pool;
}

// a pool of X's bytes for rows of k values: whole rows, up to about 2^20 values (at least one row)
const std::vector<uint8_t> & activation_pool(int64_t k, int64_t ne11) {
    static std::map<int64_t, std::vector<uint8_t>> pools;
    std::vector<uint8_t> & pool = pools[k];
    const int64_t rows = std::min<int64_t>(ne11, std::max<int64_t>(1, (1 << 20) / k));
    const size_t bytes = size_t(k * rows) * sizeof(float);
    if (pool.size() < bytes) {
        std::mt19937 gen(4321 + uint32_t(k));
        const std::vector<float> f = random_floats(size_t(k * rows), gen);
        pool.resize(bytes);
        std::memcpy(pool.data(), f.data(), bytes);
    }
    return pool;
}

void print_case(size_t i, const mm_case & c) {
    std::printf("case=%zu type=%s m=%lld k=%lld ne11=%lld", i, c.type_name.c_str(), (long long) c.m, (long long) c.k,
                (long long) c.ne11);
}

// one case: allocate the copies, run the graph; prints its line
void run_case(ggml_backend_t backend, size_t idx, const mm_case & c, const bench::timing & tm, int64_t cache_bytes) {
    const int64_t max_copies = 16384;
    const size_t copy_bytes = ggml_row_size(c.type, c.k) * size_t(c.m);
    const int64_t copies = std::min<int64_t>(max_copies, cache_bytes / int64_t(copy_bytes) + 1);

    const size_t per_copy = 2;  // W and the op (X is shared)
    const size_t n_tensors = size_t(copies) * per_copy + 1;
    ggml_init_params params = {
        /*.mem_size   =*/ggml_tensor_overhead() * n_tensors,
        /*.mem_buffer =*/nullptr,
        /*.no_alloc   =*/true,
    };
    ggml_context * ctx = ggml_init(params);
    if (ctx == nullptr) {
        print_case(idx, c);
        std::printf(" error=ggml_init failed\n");
        return;
    }
    ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, c.k, c.ne11);
    std::vector<ggml_tensor *> ws;
    std::vector<ggml_tensor *> outs;
    for (int64_t i = 0; i < copies; i++) {
        ws.push_back(ggml_new_tensor_2d(ctx, c.type, c.k, c.m));
        outs.push_back(ggml_mul_mat(ctx, ws.back(), x));
    }
    if (!ggml_backend_supports_op(backend, outs[0])) {
        print_case(idx, c);
        std::printf(" error=not supported\n");
        ggml_free(ctx);
        return;
    }
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    if (buf == nullptr) {
        print_case(idx, c);
        std::printf(" copies=%lld copy_bytes=%zu error=allocation failed\n", (long long) copies, copy_bytes);
        ggml_free(ctx);
        return;
    }
    // W: random rows, up to about 2^20 values, repeated over the matrix; X likewise. A large tensor costs
    // an upload, not a random draw and a quantization per value. The pools are made once a process, per
    // (type, k) for W and per k for X: a sweep's cases vary m and ne11 under them, and quantizing 2^20
    // values (IQ4_XS: about half a second) was most of a case's wall time
    const int64_t pool_rows = std::min<int64_t>(c.m, std::max<int64_t>(1, (1 << 20) / c.k));
    const std::vector<uint8_t> & w_data = weight_pool(c.type, c.k, pool_rows);
    bench::fill_repeating(x, activation_pool(c.k, c.ne11));
    for (ggml_tensor * w : ws) {
        bench::fill_repeating(w, w_data);
    }
    bench::time_case(backend, outs, per_copy, copy_bytes, tm, [&] { print_case(idx, c); });
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
}

}  // namespace

int main(int argc, char ** argv) {
    return bench::main_loop<mm_case>(argc, argv, "mm-bench", read_cases, run_case);
}

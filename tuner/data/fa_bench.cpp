// fa-bench: time ggml's FLASH_ATTN_EXT at exact shapes, reading cold K/V on every op.
//
// Built by tuner (tuner/measure/fa_bench.py) against a llama.cpp build's ggml headers and shared
// libraries; it uses only ggml's public API (ggml.h, ggml-alloc.h, ggml-backend.h) and bench_common.h beside it
// (the command line, the backend and the timed run it shares with the other bench program).
//
// The op is the one llama.cpp's graph hands the backend (src/llama-graph.cpp build_attn_mha) and the
// one tuner's test-backend-ops file describes (tuner/measure/kernel_bench.py fa_test_file):
//   Q: F32 [D, n_batch, n_head, 1], the permuted view of [D, n_head, n_batch];
//   K, V: views of a KV cache [D*n_head_kv, n_kv] as [D, n_kv, n_head_kv] (nb1 = a row of all heads);
//   mask: F16 [n_kv, n_batch, 1, 1] (n_batch padded to GGML_KQ_MASK_PAD where the tree defines it),
//         filled like test-backend-ops' init_tensor_kq_mask (uniform values, 20% in -inf/0 blocks);
//   scale 1/sqrt(D), no ALiBi or softcap, F32 accumulation (ggml_prec_set_acc).
//
// Unlike test-backend-ops perf (which repeats one op on one set of inputs for at least a second), each
// case allocates enough copies of Q, K, V and the mask that together they exceed --cache-mb, and one
// graph runs the op --iters times (at least once per copy), cycling through the copies, so each op reads
// K/V that the previous ones evicted from the cache, as a model's layers do. Two warm-up runs of the
// graph (-w; on a CUDA build with graphs the second captures it: bench_common.h), then one timed run:
// the mean is the timed run's wall time (ggml_backend_graph_compute synchronizes) over its ops.
//
// Usage: fa-bench -b BACKEND -f CASES [-n ITERS] [-c CACHE_MB] [-t THREADS] [-w WARMUP_RUNS] [-m TARGET_MS]
//                 [-T CASE_SECONDS]
// -m: time at least TARGET_MS of ops per case (default 0: ITERS ops). The timed run of ITERS ops is then a
// calibration: where it was shorter, a graph of enough ops to last TARGET_MS at the rate it measured
// (rounded up to 2^k or 3 * 2^k ops, at most 16384) is warmed up and timed instead (bench_common.h
// time_case), so a case of 15 us ops times about as much GPU work as one of 400 us ops.
// -T: a case running longer ends the program with exit code 124 (default 0: no limit).
// CASES: one case a line, "head_dim head_dim_v n_head n_head_kv n_kv n_batch kv_type" (kv_type f16, q8_0 or
// any ggml type name but f32); '#' starts a comment. Output: one line a case,
//   case=I hsk=.. hsv=.. nh=.. nhkv=.. nkv=.. nb=.. type=.. copies=C copy_bytes=B ops=N us_per_op=T
// or the same up to type= followed by "error=WHY". Bad arguments: a message and exit code 2.

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "bench_common.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct fa_case {
    int64_t hsk, hsv, nh, nhkv, nkv, nb;
    std::string type_name;
    ggml_type type;
};

std::vector<fa_case> read_cases(const std::string & path) {
    std::ifstream in(path);
    if (!in) {
        bench::usage("cannot read the cases file " + path);
    }
    std::vector<fa_case> cases;
    std::string line;
    int lineno = 0;
    while (std::getline(in, line)) {
        lineno++;
        line = line.substr(0, line.find('#'));
        std::istringstream ss(line);
        fa_case c{};
        if (!(ss >> c.hsk)) {
            continue;  // blank or comment
        }
        std::string extra;
        if (!(ss >> c.hsv >> c.nh >> c.nhkv >> c.nkv >> c.nb >> c.type_name) || (ss >> extra)) {
            bench::usage(path + ":" + std::to_string(lineno) +
                  ": expected 'head_dim head_dim_v n_head n_head_kv n_kv n_batch kv_type'");
        }
        c.type = GGML_TYPE_COUNT;
        for (int t = 0; t < GGML_TYPE_COUNT; t++) {
            const char * name = ggml_type_name(ggml_type(t));
            if (name != nullptr && c.type_name == name && t != GGML_TYPE_F32 && ggml_blck_size(ggml_type(t)) > 0) {
                c.type = ggml_type(t);
            }
        }
        if (c.type == GGML_TYPE_COUNT) {
            bench::usage(path + ":" + std::to_string(lineno) + ": kv_type must be a ggml type name such as f16 or q8_0 (got " +
                  c.type_name + ")");
        }
        const int64_t lim = int64_t(1) << 22;
        for (int64_t v : {c.hsk, c.hsv, c.nh, c.nhkv, c.nkv, c.nb}) {
            if (v < 1 || v > lim) {
                bench::usage(path + ":" + std::to_string(lineno) + ": sizes must be in [1, 4194304]");
            }
        }
        if (c.nh % c.nhkv != 0 || c.hsk % ggml_blck_size(c.type) != 0 || c.hsv % ggml_blck_size(c.type) != 0) {
            bench::usage(path + ":" + std::to_string(lineno) +
                  ": n_head must be a multiple of n_head_kv and head sizes multiples of the type's block");
        }
        cases.push_back(c);
    }
    return cases;
}

int64_t mask_rows(const fa_case & c) {
#ifdef GGML_KQ_MASK_PAD
    return GGML_PAD(c.nb, GGML_KQ_MASK_PAD);
#else
    return c.nb;
#endif
}

// test-backend-ops' init_tensor_kq_mask, with a fixed seed
std::vector<ggml_fp16_t> make_mask(int64_t ne0, int64_t ne1, std::mt19937 & gen) {
    std::uniform_real_distribution<float> dis(-1.0f, 1.0f);
    std::vector<float> f32(size_t(ne0 * ne1));
    for (float & x : f32) {
        x = dis(gen);
    }
    const int blck0 = 128;
    const int blck1 = 64;
    const int64_t n_blocks = int64_t(0.2 * double(ne0 * ne1) / (blck0 * blck1));
    for (int64_t b = 0; b < n_blocks; b++) {
        const int64_t p1 = int64_t(gen() % uint32_t(ne1));
        const int64_t p0 = int64_t(gen() % uint32_t(ne0));
        const bool inf = (gen() & 1) != 0;
        for (int64_t i1 = 0; i1 < blck1 && p1 + i1 < ne1; i1++) {
            for (int64_t i0 = 0; i0 < blck0 && p0 + i0 < ne0; i0++) {
                f32[size_t((p1 + i1) * ne0 + p0 + i0)] = inf ? -INFINITY : 0.0f;
            }
        }
    }
    std::vector<ggml_fp16_t> f16(f32.size());
    ggml_fp32_to_fp16_row(f32.data(), f16.data(), int64_t(f32.size()));
    return f16;
}

std::vector<uint8_t> random_rows(ggml_type type, int64_t n_per_row, int64_t nrows, std::mt19937 & gen) {
    std::uniform_real_distribution<float> dis(-1.0f, 1.0f);
    std::vector<float> f32(size_t(n_per_row * nrows));
    for (float & x : f32) {
        x = dis(gen);
    }
    std::vector<uint8_t> out(ggml_row_size(type, n_per_row) * size_t(nrows));
    if (type == GGML_TYPE_F32) {
        std::memcpy(out.data(), f32.data(), out.size());
    } else {
        ggml_quantize_chunk(type, f32.data(), out.data(), 0, nrows, n_per_row, nullptr);
    }
    return out;
}

struct fa_tensors {
    ggml_tensor * q;  // [D, n_head, n_batch] F32 before the permute
    ggml_tensor * k;  // cache [D*n_head_kv, n_kv]
    ggml_tensor * v;
    ggml_tensor * m;
    ggml_tensor * out;
};

fa_tensors build_op(ggml_context * ctx, const fa_case & c) {
    fa_tensors t{};
    t.q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, c.hsk, c.nh, c.nb);
    t.k = ggml_new_tensor_2d(ctx, c.type, c.hsk * c.nhkv, c.nkv);
    t.v = ggml_new_tensor_2d(ctx, c.type, c.hsv * c.nhkv, c.nkv);
    t.m = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, c.nkv, mask_rows(c), 1, 1);
    ggml_tensor * q = ggml_permute(ctx, t.q, 0, 2, 1, 3);
    ggml_tensor * k = ggml_view_3d(ctx, t.k, c.hsk, c.nkv, c.nhkv, t.k->nb[1], ggml_row_size(c.type, c.hsk), 0);
    ggml_tensor * v = ggml_view_3d(ctx, t.v, c.hsv, c.nkv, c.nhkv, t.v->nb[1], ggml_row_size(c.type, c.hsv), 0);
    t.out = ggml_flash_attn_ext(ctx, q, k, v, t.m, 1.0f / std::sqrt(float(c.hsk)), 0.0f, 0.0f);
    ggml_prec_set_acc(t.out, GGML_PREC_F32);
    return t;
}

void print_case(size_t i, const fa_case & c) {
    std::printf("case=%zu hsk=%lld hsv=%lld nh=%lld nhkv=%lld nkv=%lld nb=%lld type=%s", i, (long long) c.hsk,
                (long long) c.hsv, (long long) c.nh, (long long) c.nhkv, (long long) c.nkv, (long long) c.nb,
                c.type_name.c_str());
}

// one case: allocate the copies, run the graph; prints its line
void run_case(ggml_backend_t backend, size_t idx, const fa_case & c, const bench::timing & tm, int64_t cache_bytes) {
    const int64_t max_copies = 16384;
    const size_t q_bytes = size_t(c.hsk * c.nh * c.nb) * sizeof(float);
    const size_t k_bytes = ggml_row_size(c.type, c.hsk * c.nhkv) * size_t(c.nkv);
    const size_t v_bytes = ggml_row_size(c.type, c.hsv * c.nhkv) * size_t(c.nkv);
    const size_t m_bytes = size_t(c.nkv * mask_rows(c)) * sizeof(ggml_fp16_t);
    const size_t copy_bytes = q_bytes + k_bytes + v_bytes + m_bytes;
    const int64_t copies = std::min<int64_t>(max_copies, cache_bytes / int64_t(copy_bytes) + 1);

    const size_t per_copy = 8;  // q, k, v, m, the permute, two views, the op
    const size_t n_tensors = size_t(copies) * per_copy;
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
    std::vector<fa_tensors> ops;
    ops.reserve(size_t(copies));
    for (int64_t i = 0; i < copies; i++) {
        ops.push_back(build_op(ctx, c));
    }
    if (!ggml_backend_supports_op(backend, ops[0].out)) {
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
    std::mt19937 gen(1234 + uint32_t(idx));
    // K and V: random rows, up to about 2^20 values, repeated over the cache cells, so a 512 MB cache at
    // 128k cells costs an upload, not a random draw and a conversion per value
    auto pool_rows = [&](int64_t n_per_row) { return std::min<int64_t>(c.nkv, std::max<int64_t>(1, (1 << 20) / n_per_row)); };
    const std::vector<uint8_t> q_data = random_rows(GGML_TYPE_F32, c.hsk, c.nh * c.nb, gen);
    const std::vector<uint8_t> k_data = random_rows(c.type, c.hsk * c.nhkv, pool_rows(c.hsk * c.nhkv), gen);
    const std::vector<uint8_t> v_data = random_rows(c.type, c.hsv * c.nhkv, pool_rows(c.hsv * c.nhkv), gen);
    const std::vector<ggml_fp16_t> m_data = make_mask(c.nkv, mask_rows(c), gen);
    for (const fa_tensors & t : ops) {
        ggml_backend_tensor_set(t.q, q_data.data(), 0, q_data.size());
        bench::fill_repeating(t.k, k_data);
        bench::fill_repeating(t.v, v_data);
        ggml_backend_tensor_set(t.m, m_data.data(), 0, m_data.size() * sizeof(ggml_fp16_t));
    }

    std::vector<ggml_tensor *> outs;
    for (const fa_tensors & t : ops) {
        outs.push_back(t.out);
    }
    bench::time_case(backend, outs, per_copy, copy_bytes, tm, [&] { print_case(idx, c); });
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
}

}  // namespace

int main(int argc, char ** argv) {
    return bench::main_loop<fa_case>(argc, argv, "fa-bench", read_cases, run_case);
}

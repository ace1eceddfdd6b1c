// mm-bench: time ggml's MUL_MAT of quantized weights by F32 activations, reading cold weights on every op.
//
// Built by tuner (tuner/measure/mm_bench.py) against a llama.cpp build's ggml headers and shared
// libraries; it uses only ggml's public API (ggml.h, ggml-alloc.h, ggml-backend.h).
//
// The op is the one llama.cpp's graph hands the backend for a dense projection (build_lora_mm):
// ggml_mul_mat(ctx, W, X) with
//   W: the weights, src0, of a quantized type [k, m] (k values a row, m rows), filled by quantizing
//      uniform random floats with ggml_quantize_chunk (an importance matrix of ones where the type needs one);
//   X: the activations, src1, F32 [k, ne11] (ne11 = the batch size), uniform random floats;
//   out: F32 [m, ne11].
// Which kernel the backend runs is not chosen here: the CUDA backend decides between MMQ and cuBLAS in
// ggml_cuda_should_use_mmq, which a tuner-patched mmq.cu lets GGML_TUNER_MMQ_CHOICES override
// (tuner/sweep/mmq.py), so the caller sets that environment variable and this program times the op.
//
// As fa-bench (tuner/data/fa_bench.cpp): each case allocates enough copies of W that together they exceed
// --cache-mb, and one graph runs the op --iters times (at least once per copy), cycling through the copies,
// so each op reads weights that the previous ones evicted from the cache, as a model's layers do. X is
// one tensor shared by every op (a layer's activations are fresh in the cache). One warm-up run of the
// graph, then one timed run: the mean is the timed run's wall time (ggml_backend_graph_compute
// synchronizes) over its ops.
//
// Usage: mm-bench -b BACKEND -f CASES [-n ITERS] [-c CACHE_MB] [-t THREADS] [-w WARMUP_RUNS]
// CASES: one case a line, "type m k ne11" (type a quantized ggml type name such as q4_K; k a multiple of
// its block size); '#' starts a comment. Output: one line a case,
//   case=I type=.. m=.. k=.. ne11=.. copies=C copy_bytes=B ops=N us_per_op=T
// (copy_bytes: one copy of W) or the same up to ne11= followed by "error=WHY". Bad arguments (an unknown
// or unquantized type included): a message and exit code 2.

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

struct mm_case {
    std::string type_name;
    int64_t m, k, ne11;
    ggml_type type;
};

[[noreturn]] void usage(const std::string & why) {
    std::fprintf(stderr,
                 "mm-bench: %s\n"
                 "usage: mm-bench -b BACKEND -f CASES [-n ITERS] [-c CACHE_MB] [-t THREADS] [-w WARMUP_RUNS]\n",
                 why.c_str());
    std::exit(2);
}

int64_t parse_int(const char * s, const char * what, int64_t lo, int64_t hi) {
    char * end = nullptr;
    const long long v = std::strtoll(s, &end, 10);
    if (end == s || *end != '\0' || v < lo || v > hi) {
        usage(std::string(what) + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
              "] (got '" + s + "')");
    }
    return v;
}

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
        usage("cannot read the cases file " + path);
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
            usage(where + "expected 'type m k ne11'");
        }
        c.type = quantized_type(c.type_name);
        if (c.type == GGML_TYPE_COUNT) {
            usage(where + "type must be a quantized ggml type name such as q4_0 or q4_K (got " + c.type_name + ")");
        }
        const int64_t lim = int64_t(1) << 20;
        for (int64_t v : {c.m, c.k, c.ne11}) {
            if (v < 1 || v > lim) {
                usage(where + "sizes must be in [1, 1048576]");
            }
        }
        if (c.k % ggml_blck_size(c.type) != 0) {
            usage(where + "k must be a multiple of " + c.type_name + "'s block size " +
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

void print_case(size_t i, const mm_case & c) {
    std::printf("case=%zu type=%s m=%lld k=%lld ne11=%lld", i, c.type_name.c_str(), (long long) c.m, (long long) c.k,
                (long long) c.ne11);
}

// one case: allocate the copies, run the graph; prints its line
void run_case(ggml_backend_t backend, size_t idx, const mm_case & c, int64_t iters, int64_t cache_bytes,
              int64_t warmup) {
    const int64_t max_copies = 16384;
    const size_t copy_bytes = ggml_row_size(c.type, c.k) * size_t(c.m);
    const int64_t copies = std::min<int64_t>(max_copies, cache_bytes / int64_t(copy_bytes) + 1);
    const int64_t n_ops = std::max<int64_t>(iters, copies);

    const size_t n_tensors = size_t(copies) * 2 + 1;
    const size_t graph_size = size_t(n_ops + copies * 2 + 16);
    ggml_init_params params = {
        /*.mem_size   =*/ggml_tensor_overhead() * n_tensors + ggml_graph_overhead_custom(graph_size, false),
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
    std::mt19937 gen(1234 + uint32_t(idx));
    // W: random rows, up to about 2^20 values, repeated over the matrix, so a large W costs an upload,
    // not a random draw and a quantization per value
    const int64_t pool_rows = std::min<int64_t>(c.m, std::max<int64_t>(1, (1 << 20) / c.k));
    const std::vector<uint8_t> w_data = quantized_rows(c.type, c.k, pool_rows, gen);
    const std::vector<float> x_data = random_floats(size_t(c.k * c.ne11), gen);
    ggml_backend_tensor_set(x, x_data.data(), 0, x_data.size() * sizeof(float));
    for (ggml_tensor * w : ws) {
        const size_t n = ggml_nbytes(w);
        for (size_t off = 0; off < n; off += w_data.size()) {
            ggml_backend_tensor_set(w, w_data.data(), off, std::min(w_data.size(), n - off));
        }
    }

    ggml_cgraph * gf = ggml_new_graph_custom(ctx, graph_size, false);
    for (ggml_tensor * out : outs) {
        ggml_build_forward_expand(gf, out);
    }
    for (int64_t i = copies; i < n_ops; i++) {
        ggml_graph_add_node(gf, outs[size_t(i % copies)]);
    }

    for (int64_t w = 0; w < warmup; w++) {
        if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {
            print_case(idx, c);
            std::printf(" copies=%lld copy_bytes=%zu error=graph compute failed\n", (long long) copies, copy_bytes);
            ggml_backend_buffer_free(buf);
            ggml_free(ctx);
            return;
        }
    }
    ggml_backend_synchronize(backend);
    const int64_t t0 = ggml_time_us();
    const ggml_status status = ggml_backend_graph_compute(backend, gf);
    ggml_backend_synchronize(backend);
    const int64_t t1 = ggml_time_us();
    print_case(idx, c);
    if (status != GGML_STATUS_SUCCESS) {
        std::printf(" copies=%lld copy_bytes=%zu error=graph compute failed\n", (long long) copies, copy_bytes);
    } else {
        std::printf(" copies=%lld copy_bytes=%zu ops=%lld us_per_op=%.3f\n", (long long) copies, copy_bytes,
                    (long long) n_ops, double(t1 - t0) / double(n_ops));
    }
    std::fflush(stdout);
    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
}

}  // namespace

int main(int argc, char ** argv) {
    std::string backend_name;
    std::string cases_path;
    int64_t iters = 50;
    int64_t cache_mb = 128;
    int64_t threads = std::max<int64_t>(1, int64_t(std::thread::hardware_concurrency()) / 2);
    int64_t warmup = 1;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (i + 1 >= argc) {
            usage("option " + a + " needs a value");
        }
        const char * val = argv[++i];
        if (a == "-b") {
            backend_name = val;
        } else if (a == "-f") {
            cases_path = val;
        } else if (a == "-n") {
            iters = parse_int(val, "-n", 1, 1000000);
        } else if (a == "-c") {
            cache_mb = parse_int(val, "-c", 0, 1 << 20);
        } else if (a == "-t") {
            threads = parse_int(val, "-t", 1, 4096);
        } else if (a == "-w") {
            warmup = parse_int(val, "-w", 0, 1000);
        } else {
            usage("unknown option " + a);
        }
    }
    if (backend_name.empty() || cases_path.empty()) {
        usage("-b BACKEND and -f CASES are required");
    }
    const std::vector<mm_case> cases = read_cases(cases_path);
    if (cases.empty()) {
        usage("no cases in " + cases_path);
    }

    ggml_time_init();
    ggml_backend_load_all();
    ggml_backend_t backend = ggml_backend_init_by_name(backend_name.c_str(), nullptr);
    if (backend == nullptr) {
        std::string names;
        for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
            names += std::string(i ? ", " : "") + ggml_backend_dev_name(ggml_backend_dev_get(i));
        }
        usage("no backend named " + backend_name + " (this build has: " + names + ")");
    }
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    if (dev != nullptr) {
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
        auto set_threads =
            (ggml_backend_set_n_threads_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads");
        if (set_threads != nullptr) {
            set_threads(backend, int(threads));
        }
    }
    std::printf("mm-bench backend=%s iters=%lld cache_mb=%lld warmup=%lld\n", ggml_backend_name(backend),
                (long long) iters, (long long) cache_mb, (long long) warmup);
    std::fflush(stdout);
    for (size_t i = 0; i < cases.size(); i++) {
        run_case(backend, i, cases[i], iters, cache_mb << 20, warmup);
    }
    ggml_backend_free(backend);
    return 0;
}

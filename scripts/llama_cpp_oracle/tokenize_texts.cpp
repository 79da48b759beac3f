// llama.cpp's tokenizer over many texts in one process: the oracle for tests/data/llama_cpp_tokens/.
// Build: see scripts/make_tokenizer_fixtures.py (it compiles this against a CPU build of libllama).
// Usage: tokenize_texts VOCAB.gguf TEXTS  (TEXTS: UTF-8 texts separated by NUL bytes)
// Prints one line per text: the ids llama_tokenize gives with add_special=false, parse_special=true,
// then one line "add_bos <0|1>".
#include "llama.h"

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static void quiet(enum ggml_log_level, const char *, void *) {}

int main(int argc, char ** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s VOCAB.gguf TEXTS\n", argv[0]);
        return 2;
    }
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model_params params = llama_model_default_params();
    params.vocab_only = true;
    llama_model * model = llama_model_load_from_file(argv[1], params);
    if (model == nullptr) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);

    std::ifstream in(argv[2], std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    const std::string all = buffer.str();

    size_t pos = 0;
    while (pos < all.size()) {
        size_t end = all.find('\0', pos);
        if (end == std::string::npos) {
            end = all.size();
        }
        const std::string text = all.substr(pos, end - pos);
        pos = end + 1;
        std::vector<llama_token> ids(text.size() * 2 + 16);
        int n = llama_tokenize(vocab, text.data(), (int) text.size(), ids.data(), (int) ids.size(), false, true);
        if (n < 0) {
            ids.resize(-n);
            n = llama_tokenize(vocab, text.data(), (int) text.size(), ids.data(), (int) ids.size(), false, true);
        }
        for (int i = 0; i < n; ++i) {
            printf(i ? " %d" : "%d", ids[i]);
        }
        printf("\n");
    }
    printf("add_bos %d\n", llama_vocab_get_add_bos(vocab) ? 1 : 0);
    llama_model_free(model);
    return 0;
}

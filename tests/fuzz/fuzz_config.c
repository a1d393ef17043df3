/* config.json parsing (model/config.c): Hugging Face names and the official inference/config.json names.
 * Input: the file's text. A config that parses must satisfy what the rest of the engine indexes with. */
#include "fuzz.h"
#include "model/config.h"
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fuzz_strndup(data, size);
    dsv4_config cfg;
    dsv4_error err = {0};
    int rc = dsv4_config_parse(text, "config.json", &cfg, &err);
    if (rc) {
        fuzz_check_error(rc, &err);
    } else {
        /* compress_ratio[] is indexed by every backbone layer and every speculative stage */
        FUZZ_CHECK(cfg.n_layers >= 1 && cfg.n_mtp >= 0 && cfg.n_layers + cfg.n_mtp <= DSV4_MAX_LAYERS,
                   "layers %d + stages %d outside 1..%d", cfg.n_layers, cfg.n_mtp, DSV4_MAX_LAYERS);
        for (int i = 0; i < cfg.n_layers + cfg.n_mtp; i++)
            FUZZ_CHECK(cfg.compress_ratio[i] == 0 || cfg.compress_ratio[i] == 4 || cfg.compress_ratio[i] == 128,
                       "layer %d ratio %d", i, cfg.compress_ratio[i]);
        FUZZ_CHECK(cfg.n_dspark_targets >= 0 && cfg.n_dspark_targets <= 8, "%d targets", cfg.n_dspark_targets);
        FUZZ_CHECK(dsv4_config_validate(&cfg, &err) == 0, "parsed but invalid: %s", err.msg);
    }
    free(text);
    return 0;
}

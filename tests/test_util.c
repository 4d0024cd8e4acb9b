/* util: error slot, overflow-checked arithmetic, file reading. */
#include "test.h"
#include "util/util.h"

int main(void) {
    CHECK(nl_err("x %d", 3) == -1);
    CHECK(strcmp(nl_last_error(), "x 3") == 0);
    nl_err_prefix("file.gguf");
    CHECK(strcmp(nl_last_error(), "file.gguf: x 3") == 0);
    uint64_t r;
    CHECK(nl_mul_ok(1ull << 32, 1ull << 31, &r) == 0 && r == (1ull << 63));
    CHECK(nl_mul_ok(1ull << 32, 1ull << 32, &r) == -1);
    CHECK(nl_add_ok(UINT64_MAX, 1, &r) == -1);
    size_t len;
    CHECK(nl_read_file("/nonexistent/nightlora", &len) == NULL);
    CHECK(strstr(nl_last_error(), "/nonexistent/nightlora") != NULL);
    return nl_t_done();
}

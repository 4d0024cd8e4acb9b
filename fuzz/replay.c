/* fuzz/replay.c: a main() for a fuzz harness without libFuzzer. Runs the harness's
 * LLVMFuzzerTestOneInput once on every regular file under each argument (a file or a
 * directory, not recursive, in name order), so `make test` replays the committed corpus and
 * crash inputs with the normal compiler (and under ASan/UBSan with `make test SANITIZE=1`).
 * A harness oracle failure aborts the process, which fails the test. A missing directory is
 * skipped with a note (git does not keep empty crash folders). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return -1;
    }
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    for (;;) {
        if (!buf) break;
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        uint8_t *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    int err = ferror(f);
    fclose(f);
    if (!buf || err) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        free(buf);
        return -1;
    }
    /* an exact-size copy, so a read past the input is caught by ASan as under libFuzzer */
    uint8_t *exact = malloc(n ? n : 1);
    if (!exact) {
        free(buf);
        return -1;
    }
    memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

static int by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

int main(int argc, char **argv) {
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int files = 0, errors = 0;
    clock_t t0 = clock();
    for (int a = 1; a < argc; a++) {
        struct stat st;
        if (stat(argv[a], &st) != 0) {
            fprintf(stderr, "replay: note: %s does not exist, skipped\n", argv[a]);
            continue;
        }
        if (!S_ISDIR(st.st_mode)) {
            errors += run_file(argv[a]) != 0;
            files++;
            continue;
        }
        struct dirent **ents = NULL;
        int n = scandir(argv[a], &ents, NULL, by_name);
        if (n < 0) {
            fprintf(stderr, "replay: cannot list %s\n", argv[a]);
            errors++;
            continue;
        }
        for (int i = 0; i < n; i++) {
            char path[4096];
            if (ents[i]->d_name[0] != '.') {
                snprintf(path, sizeof path, "%s/%s", argv[a], ents[i]->d_name);
                if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
                    errors += run_file(path) != 0;
                    files++;
                }
            }
            free(ents[i]);
        }
        free(ents);
    }
    printf("replayed %d inputs in %.2f s CPU, %d unreadable\n", files, (double)(clock() - t0) / CLOCKS_PER_SEC, errors);
    /* the test must be able to fail: no input at all means the corpus went missing */
    if (files == 0) {
        fprintf(stderr, "replay: no inputs found\n");
        return 1;
    }
    return errors ? 1 : 0;
}

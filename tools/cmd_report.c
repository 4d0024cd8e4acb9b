/* nightlora report --log train-log.jsonl --out report.html [--run DIR/run.json | --run DIR] [--title T]
 * One self-contained HTML file (inline SVG and CSS, no script, nothing fetched) drawn from a
 * --log-json file: the losses, accuracy, learning rate, tokens/s with the pauses, service vs CPU
 * time per step, and the run's settings (eval/report.h). */
#include <stdio.h>

#include "cli.h"
#include "eval/report.h"

int nl_cmd_report(int argc, char **argv) {
    static const char *const known[] = {"log", "out", "run", "title", NULL};
    if (nl_cli_check("report", argc, argv, known, NULL)) return 2;
    nl_report_opts o = {0};
    o.log = nl_cli_opt(argc, argv, "log");
    o.run_json = nl_cli_opt(argc, argv, "run");
    o.title = nl_cli_opt(argc, argv, "title");
    const char *out = nl_cli_opt(argc, argv, "out");
    if (!o.log || !out) {
        fprintf(stderr, "nightlora report: --log and --out are required (see 'nightlora help report')\n");
        return 2;
    }
    static const char *const inputs[] = {"log", "run", NULL};
    static const char *const outputs[] = {"out", NULL};
    if (nl_cli_no_overwrite("report", argc, argv, inputs, outputs, NULL)) return 2;
    if (nl_report_write(&o, out)) return nl_cli_fail("report");
    printf("report written to %s\n", out);
    return 0;
}

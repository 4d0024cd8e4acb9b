/* nn/ reaching up without an include: local prototypes of what higher rooms define. The
 * include check cannot see these; the link-level check must (4 breaks: two functions, one
 * variable, one public nightlora_* function). */
int nl_train_fixture_step(int x);
extern float nl_eval_fixture_score(float x);
extern int nl_train_fixture_steps_done;
int nightlora_fixture_version(void);

int nl_nn_fixture_row(int x) { return x + 1; }

int nl_nn_fixture_escape(int x) {
    return nl_train_fixture_step(x) + (int)nl_eval_fixture_score((float)x) + nl_train_fixture_steps_done + nightlora_fixture_version();
}

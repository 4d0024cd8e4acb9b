/* nn/ reaching up without an include: local prototypes of functions two higher rooms define.
 * The include check cannot see these; the link-level check must (2 breaks). */
int nl_train_fixture_step(int x);
extern float nl_eval_fixture_score(float x);

int nl_nn_fixture_row(int x) { return x + 1; }

int nl_nn_fixture_escape(int x) { return nl_train_fixture_step(x) + (int)nl_eval_fixture_score((float)x); }

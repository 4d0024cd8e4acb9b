/* train/ using nn/ (below it): allowed; it also defines what nn/escape.c takes from above */
int nl_nn_fixture_row(int x);

int nl_train_fixture_steps_done = 0;

int nl_train_fixture_step(int x) { return nl_nn_fixture_row(x) * 2; }

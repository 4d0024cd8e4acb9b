/* a header of the fixture's train/ (so that <train/trainer.h> names a room's file) */
int nl_train_fixture(void);

/* api/: defines the public symbol nn/escape.c takes from above */
int nightlora_fixture_version(void) { return 4; }

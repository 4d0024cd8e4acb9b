/* #include "data/dataset.h" is not done here */
static const char *s = "#include \"data/x.h\"";

// Stand-in for an FA translation unit; the tuner TU header may define TOY_ROWS.
#ifndef TOY_ROWS
#define TOY_ROWS 1
#endif
int toy_rows() { return TOY_ROWS; }

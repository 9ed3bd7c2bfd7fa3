/* Reading a Python int as a C integer, for the compiled parts (mrc/transport/_fastc.c, mrc/sim/_simc.c).
 *
 * PyLong_AsLongLong and PyLong_AsUnsignedLongLong convert an int of more than one 30-bit digit (every
 * time in ns) through _PyLong_AsByteArray, several times slower than PyLong_AsLong's digit loop; where
 * long is 64 bits (LP64) the two give the same values and errors. */
#ifndef MRC_CINT_H
#define MRC_CINT_H

#include <limits.h>

#if LONG_MAX == LLONG_MAX
#define AS_LL(o) ((long long)PyLong_AsLong(o))
#define AS_ULL(o) ((unsigned long long)PyLong_AsUnsignedLong(o))
#else
#define AS_LL(o) PyLong_AsLongLong(o)
#define AS_ULL(o) PyLong_AsUnsignedLongLong(o)
#endif

#endif

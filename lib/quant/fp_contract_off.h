// Turns off floating-point contraction for the rest of the including file. Bit-identity with gguf's
// numpy reference needs every float multiply and add rounded on its own: a fused multiply-add (which
// GCC forms even in ISO C++ mode once the target has FMA) changes the last bit. Include it LAST.
// No #pragma once: each including file needs the pragma.

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

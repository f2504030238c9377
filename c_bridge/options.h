/*
 * The bridge's own options among an adapter's "key=value" list: the
 * transport and its settings are read here, in C, and never reach the
 * adapter, which refuses names it does not declare.
 */

#ifndef DBWRAP_PY_OPTIONS_H
#define DBWRAP_PY_OPTIONS_H

#include "samba_abi.h"

/*
 * The value of `key` (any case) in `options`, the last one given, or NULL. *rest gets
 * the list without any `key=` entry: a talloc child of mem_ctx, or NULL if
 * that allocation failed. Its strings are still the caller's.
 */
const char *dbwrap_py_option_take(TALLOC_CTX *mem_ctx,
				  const char *const *options, const char *key,
				  const char *const **rest);

/*
 * A copy of the list and of its strings, a talloc child of mem_ctx, or NULL
 * when out of memory: for what must outlive the open that was given them.
 */
const char *const *dbwrap_py_options_copy(TALLOC_CTX *mem_ctx,
					  const char *const *options);

#endif /* DBWRAP_PY_OPTIONS_H */

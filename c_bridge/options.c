/* The bridge's own options (options.h). */

#include <string.h>
#include <strings.h>

#include "options.h"

static const char *option_value(const char *pair, const char *key)
{
	size_t keylen = strlen(key);

	return (strncasecmp(pair, key, keylen) == 0 && pair[keylen] == '=')
		? pair + keylen + 1 : NULL;
}

const char *dbwrap_py_option_take(TALLOC_CTX *mem_ctx,
				  const char *const *options, const char *key,
				  const char *const **rest)
{
	const char *value = NULL, *found;
	const char **kept;
	size_t n = 0, i, k = 0;

	while (options != NULL && options[n] != NULL) {
		n++;
	}
	kept = talloc_array(mem_ctx, const char *, n + 1);
	for (i = 0; i < n; i++) {
		found = option_value(options[i], key);
		if (found != NULL) {
			value = found;
		} else if (kept != NULL) {
			kept[k++] = options[i];
		}
	}
	if (kept != NULL) {
		kept[k] = NULL;
	}
	*rest = kept;
	return value;
}

const char *const *dbwrap_py_options_copy(TALLOC_CTX *mem_ctx,
					  const char *const *options)
{
	const char **copy;
	size_t n = 0, i;

	while (options != NULL && options[n] != NULL) {
		n++;
	}
	copy = talloc_zero_array(mem_ctx, const char *, n + 1);
	for (i = 0; copy != NULL && i < n; i++) {
		copy[i] = talloc_strdup(copy, options[i]);
		if (copy[i] == NULL) {
			TALLOC_FREE(copy);
		}
	}
	return copy;
}

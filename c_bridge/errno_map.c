/*
 * errno for a failed db_open_py(): db_open's callers (smbd among them)
 * report strerror(errno), so it should say what kind of failure it was.
 */

#include <errno.h>

#include "errno_map.h"

int dbwrap_py_errno_from_ntstatus(NTSTATUS status)
{
	/* automatic: NTSTATUS is a struct, not a constant expression */
	const struct {
		NTSTATUS status;
		int err;
	} map[] = {
		{ NT_STATUS_INVALID_PARAMETER, EINVAL },
		{ NT_STATUS_ACCESS_DENIED, EACCES },
		{ NT_STATUS_NO_MEMORY, ENOMEM },
		{ NT_STATUS_IO_TIMEOUT, ETIMEDOUT },
		{ NT_STATUS_DEVICE_NOT_READY, ECONNREFUSED },
		{ NT_STATUS_NOT_FOUND, ENOENT },
	};
	size_t i;

	for (i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
		if (NT_STATUS_EQUAL(status, map[i].status)) {
			return map[i].err;
		}
	}
	return EIO;
}

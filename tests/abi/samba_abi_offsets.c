/*
 * The offsets c_bridge/samba_abi.h gives the fields Samba's accessors read,
 * printed like scripts/samba-abi-probe.sh prints what the installed Samba's
 * binaries read: tests/python/test_samba_abi.py compares the two.
 */
#include <stddef.h>
#include <stdio.h>

#include "samba_abi.h"

int main(void)
{
	printf("dbwrap_get_seqnum: 0x%zx\n", offsetof(struct db_context, get_seqnum));
	printf("dbwrap_wipe: 0x%zx\n", offsetof(struct db_context, wipe));
	printf("dbwrap_name: 0x%zx\n", offsetof(struct db_context, name));
	printf("dbwrap_is_persistent: 0x%zx\n", offsetof(struct db_context, persistent));
#if DBWRAP_PY_SAMBA_4_25_LAYOUT
	printf("dbwrap_record_get_flags: 0x%zx\n", offsetof(struct db_record, flags));
#else
	printf("dbwrap_record_get_flags: absent\n");
#endif
	return 0;
}

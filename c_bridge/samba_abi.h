/*
 * The parts of Samba's ABI that dbwrap_py builds against.
 *
 * Samba's dev packages ship no dbwrap headers; dbwrap lives in a private
 * library (Debian 12: libdbwrap-samba4.so.0, Debian 13:
 * libdbwrap-private-samba.so.0). Everything below is declared here, once,
 * from the facts; no Samba code is copied.
 *
 * The releases checked, and how (the table below is the one place that
 * says which releases the bridge builds for):
 * - 4.17.12 to 4.24.x: lib/dbwrap/dbwrap_private.h (struct db_context,
 *   struct db_record) is the same blob at the tags samba-4.17.12,
 *   samba-4.22.11, samba-4.23.11 and samba-4.24.0 (3ac5ebf9), and no commit
 *   touched it on those branches after June 2021; so are
 *   source3/lib/dbwrap/dbwrap_open.h (db_open) and lib/tdb/include/tdb.h.
 *   db_open_tdb, db_open_rbt, enum dbwrap_lock_order, every dbwrap_*
 *   front-end function declared below, lp_parm_bool/lp_parm_int/lp_dump,
 *   samba_version_string, nt_errstr and the debug calls have the same
 *   prototypes. Debian's 4.17.12, 4.22.11 and 4.24.7 binaries read the same
 *   offsets (scripts/samba-abi-probe.sh).
 * - 4.25.1: Samba's master of August 2026 (4.25.0pre1; the 4.25.1 source is
 *   not in Debian's registry here) and Debian sid's 4.25.1 binaries, whose
 *   accessors read the offsets of the 4.25 layout below. struct db_context
 *   gained traverse_per_rec_persistent_read (after traverse_read) and
 *   `uint64_t flags` (before lock_order), and wipe takes a struct
 *   dbwrap_wipe_flags; struct db_record gained `flags` (before
 *   private_data). db_open() now calls db_open_ex(), which g_lock also
 *   calls directly: the preload takes over db_open_ex too.
 * - What differs is also behaviour: from 4.22.1 db_open() reads
 *   "tdb_hash_size:<db>" (DBWRAP_PY_SAMBA_DB_OPEN_TDB_HASH_SIZE below);
 *   every release reads "tdb_hashsize:<db>" when the caller passes 0.
 *   dbwrap_merge_dbufs() and g_lock_lock() changed signature in 4.18; the
 *   bridge uses neither.
 *
 * The Makefile passes the installed Samba's release (DBWRAP_PY_SAMBA_VERSION,
 * "4.17.12", and DBWRAP_PY_SAMBA_VERSION_NUMBER, 41712); what differs between
 * releases is chosen from it here, never by editing this file.
 */

#ifndef DBWRAP_PY_SAMBA_ABI_H
#define DBWRAP_PY_SAMBA_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <talloc.h>
#include <tdb.h>

#if !defined(DBWRAP_PY_SAMBA_VERSION) || !defined(DBWRAP_PY_SAMBA_VERSION_NUMBER)
#error "build with make: it passes the installed Samba's version (DBWRAP_PY_SAMBA_VERSION)"
#endif

/*
 * The table of checked releases. Any other release is a build error, never
 * a guess: a wrong layout makes smbd read its lock order from the wrong
 * place and panic. To add one, compare its lib/dbwrap/dbwrap_private.h,
 * lib/dbwrap/dbwrap.h and source3/lib/dbwrap/dbwrap_open.h with the
 * declarations below, run scripts/samba-abi-probe.sh on its samba-libs
 * package, and extend the table.
 */
#if DBWRAP_PY_SAMBA_VERSION_NUMBER >= 41712 && DBWRAP_PY_SAMBA_VERSION_NUMBER < 42500
#define DBWRAP_PY_SAMBA_4_25_LAYOUT 0
#elif DBWRAP_PY_SAMBA_VERSION_NUMBER == 42501
#define DBWRAP_PY_SAMBA_4_25_LAYOUT 1
#else
#error "samba_abi.h was not checked against this Samba release (see DBWRAP_PY_SAMBA_VERSION on the command line): checked are 4.17.12 to 4.24.x and 4.25.1. Compare its lib/dbwrap/dbwrap_private.h and source3/lib/dbwrap/dbwrap_open.h with samba_abi.h, run scripts/samba-abi-probe.sh, then add the release to the table in samba_abi.h."
#endif

/* 4.22.1 (commit ae0a023845d): db_open() takes hash_size from "tdb_hash_size:<db>" */
#define DBWRAP_PY_SAMBA_DB_OPEN_TDB_HASH_SIZE (DBWRAP_PY_SAMBA_VERSION_NUMBER >= 42201)

/*
 * NTSTATUS: Samba builds it as a one-member struct (HAVE_IMMEDIATE_STRUCTURES).
 * On x86-64 that is passed and returned exactly like a uint32_t.
 */
typedef struct { uint32_t v; } NTSTATUS;
#define NT_STATUS(x) ((NTSTATUS) { (x) })
#define NT_STATUS_V(x) ((x).v)
#define NT_STATUS_IS_OK(x) (NT_STATUS_V(x) == 0)
#define NT_STATUS_EQUAL(a, b) (NT_STATUS_V(a) == NT_STATUS_V(b))

#define NT_STATUS_OK                     NT_STATUS(0x00000000)
#define NT_STATUS_UNSUCCESSFUL           NT_STATUS(0xC0000001)
#define NT_STATUS_INVALID_PARAMETER      NT_STATUS(0xC000000D)
#define NT_STATUS_NO_MEMORY              NT_STATUS(0xC0000017)
#define NT_STATUS_ACCESS_DENIED          NT_STATUS(0xC0000022)
#define NT_STATUS_OBJECT_NAME_NOT_FOUND  NT_STATUS(0xC0000034)
#define NT_STATUS_OBJECT_NAME_COLLISION  NT_STATUS(0xC0000035)
#define NT_STATUS_FILE_LOCK_CONFLICT     NT_STATUS(0xC0000054)
#define NT_STATUS_INSUFFICIENT_RESOURCES NT_STATUS(0xC000009A)
#define NT_STATUS_MEDIA_WRITE_PROTECTED  NT_STATUS(0xC00000A2)
#define NT_STATUS_DEVICE_NOT_READY       NT_STATUS(0xC00000A3)
#define NT_STATUS_IO_TIMEOUT             NT_STATUS(0xC00000B5)
#define NT_STATUS_NOT_SUPPORTED          NT_STATUS(0xC00000BB)
#define NT_STATUS_INVALID_NETWORK_RESPONSE NT_STATUS(0xC00000C3)
#define NT_STATUS_INTERNAL_DB_CORRUPTION NT_STATUS(0xC00000E4)
#define NT_STATUS_INTERNAL_ERROR         NT_STATUS(0xC00000E5)
#define NT_STATUS_INTERNAL_DB_ERROR      NT_STATUS(0xC0000158)
#define NT_STATUS_NOT_FOUND              NT_STATUS(0xC0000225)

/* lib/dbwrap/dbwrap.h: NONE disables the lock-order check for a database. */
enum dbwrap_lock_order {
	DBWRAP_LOCK_ORDER_NONE = 0,
	DBWRAP_LOCK_ORDER_1 = 1,
	DBWRAP_LOCK_ORDER_2 = 2,
	DBWRAP_LOCK_ORDER_3 = 3,
	DBWRAP_LOCK_ORDER_4 = 4,
};

#if DBWRAP_PY_SAMBA_4_25_LAYOUT
/* lib/dbwrap/dbwrap.h, 4.25 */
#define DBWRAP_FLAG_PER_REC_PERSISTENT 0x0000000000000002ULL /* db_open */
#define DBWRAP_STORE_PERSISTENT 0x100 /* a store flag, beside tdb's */
struct db_record_flags {
	bool persistent : 1;
};
struct dbwrap_wipe_flags {
	bool wipe_default : 1;
	bool wipe_persistent_backup_db : 1; /* DBWRAP_DROP_PERSISTENT */
};
#endif

enum dbwrap_req_state;
struct tevent_context;
struct tevent_req;

/* lib/dbwrap/dbwrap_private.h (4.25: flags) */
struct db_record {
	struct db_context *db;
	TDB_DATA key, value;
	bool value_valid;
	NTSTATUS (*storev)(struct db_record *rec, const TDB_DATA *dbufs,
			   int num_dbufs, int flag);
	NTSTATUS (*delete_rec)(struct db_record *rec);
#if DBWRAP_PY_SAMBA_4_25_LAYOUT
	struct db_record_flags flags;
#endif
	void *private_data;
};

typedef void (*dbwrap_parser_fn)(TDB_DATA key, TDB_DATA data,
				 void *private_data);
typedef void (*dbwrap_do_locked_fn)(struct db_record *rec, TDB_DATA value,
				    void *private_data);
typedef int (*dbwrap_traverse_fn)(struct db_record *rec, void *private_data);

/* lib/dbwrap/dbwrap_private.h (4.25: three changes, marked) */
struct db_context {
	struct db_record *(*fetch_locked)(struct db_context *db,
					  TALLOC_CTX *mem_ctx,
					  TDB_DATA key);
	int (*traverse)(struct db_context *db, dbwrap_traverse_fn f,
			void *private_data);
	int (*traverse_read)(struct db_context *db, dbwrap_traverse_fn f,
			     void *private_data);
#if DBWRAP_PY_SAMBA_4_25_LAYOUT
	int (*traverse_per_rec_persistent_read)(struct db_context *db,
						dbwrap_traverse_fn f,
						void *private_data);
#endif
	int (*get_seqnum)(struct db_context *db);
	int (*transaction_start)(struct db_context *db);
	NTSTATUS (*transaction_start_nonblock)(struct db_context *db);
	int (*transaction_commit)(struct db_context *db);
	int (*transaction_cancel)(struct db_context *db);
	NTSTATUS (*parse_record)(struct db_context *db, TDB_DATA key,
				 dbwrap_parser_fn parser,
				 void *private_data);
	struct tevent_req *(*parse_record_send)(
		TALLOC_CTX *mem_ctx,
		struct tevent_context *ev,
		struct db_context *db,
		TDB_DATA key,
		dbwrap_parser_fn parser,
		void *private_data,
		enum dbwrap_req_state *req_state);
	NTSTATUS (*parse_record_recv)(struct tevent_req *req);
	NTSTATUS (*do_locked)(struct db_context *db, TDB_DATA key,
			      dbwrap_do_locked_fn fn, void *private_data);
	int (*exists)(struct db_context *db, TDB_DATA key);
#if DBWRAP_PY_SAMBA_4_25_LAYOUT
	int (*wipe)(struct db_context *db, struct dbwrap_wipe_flags flags);
#else
	int (*wipe)(struct db_context *db);
#endif
	int (*check)(struct db_context *db);
	size_t (*id)(struct db_context *db, uint8_t *id, size_t idlen);

	const char *name;
	void *private_data;
#if DBWRAP_PY_SAMBA_4_25_LAYOUT
	uint64_t flags; /* db_open's dbwrap_flags */
#endif
	enum dbwrap_lock_order lock_order;
	bool persistent;
};

/*
 * db_open() and the native backends' openers, same argument list
 * (source3/lib/dbwrap/dbwrap_open.h, lib/dbwrap/dbwrap_tdb.h).
 * db_open lives in libsmbconf.so.0, db_open_tdb/db_open_rbt in the
 * private dbwrap library.
 */
struct db_context *db_open(TALLOC_CTX *mem_ctx, const char *name,
			   int hash_size, int tdb_flags, int open_flags,
			   mode_t mode, enum dbwrap_lock_order lock_order,
			   uint64_t dbwrap_flags);
/* 4.25 (absent before): db_open calls it, and so does g_lock (g_lock.tdb) */
struct messaging_context;
struct ctdbd_connection;
struct db_context *db_open_ex(TALLOC_CTX *mem_ctx, struct tevent_context *ev,
			      struct messaging_context *msg,
			      struct ctdbd_connection *ctdb_conn,
			      const char *name, int hash_size, int tdb_flags,
			      int open_flags, mode_t mode,
			      enum dbwrap_lock_order lock_order,
			      uint64_t dbwrap_flags);
struct db_context *db_open_tdb(TALLOC_CTX *mem_ctx, const char *name,
			       int hash_size, int tdb_flags, int open_flags,
			       mode_t mode, enum dbwrap_lock_order lock_order,
			       uint64_t dbwrap_flags);
struct db_context *db_open_rbt(TALLOC_CTX *mem_ctx);

/* The dbwrap front end (lib/dbwrap/dbwrap.h), used by the tests. */
TDB_DATA dbwrap_record_get_key(const struct db_record *rec);
TDB_DATA dbwrap_record_get_value(const struct db_record *rec);
NTSTATUS dbwrap_record_store(struct db_record *rec, TDB_DATA data, int flags);
NTSTATUS dbwrap_record_storev(struct db_record *rec, const TDB_DATA *dbufs,
			      int num_dbufs, int flags);
NTSTATUS dbwrap_record_delete(struct db_record *rec);
struct db_record *dbwrap_fetch_locked(struct db_context *db,
				      TALLOC_CTX *mem_ctx, TDB_DATA key);
NTSTATUS dbwrap_do_locked(struct db_context *db, TDB_DATA key,
			  dbwrap_do_locked_fn fn, void *private_data);
NTSTATUS dbwrap_delete(struct db_context *db, TDB_DATA key);
NTSTATUS dbwrap_store(struct db_context *db, TDB_DATA key, TDB_DATA data,
		      int flags);
NTSTATUS dbwrap_fetch(struct db_context *db, TALLOC_CTX *mem_ctx,
		      TDB_DATA key, TDB_DATA *value);
bool dbwrap_exists(struct db_context *db, TDB_DATA key);
NTSTATUS dbwrap_traverse(struct db_context *db, dbwrap_traverse_fn f,
			 void *private_data, int *count);
NTSTATUS dbwrap_traverse_read(struct db_context *db, dbwrap_traverse_fn f,
			      void *private_data, int *count);
NTSTATUS dbwrap_parse_record(struct db_context *db, TDB_DATA key,
			     dbwrap_parser_fn parser, void *private_data);
NTSTATUS dbwrap_trans_store(struct db_context *db, TDB_DATA key, TDB_DATA dbuf,
			    int flag);
#if DBWRAP_PY_SAMBA_4_25_LAYOUT
int dbwrap_wipe(struct db_context *db, struct dbwrap_wipe_flags flags);
#else
int dbwrap_wipe(struct db_context *db);
#endif
#if DBWRAP_PY_SAMBA_4_25_LAYOUT
struct db_record_flags dbwrap_record_get_flags(struct db_record *rec);
NTSTATUS dbwrap_traverse_per_rec_persistent_read(struct db_context *db,
						 dbwrap_traverse_fn f,
						 void *private_data, int *count);
#endif
/* dbwrap_wipe() of the database (4.25: not a per-record-persistent one's copies) */
static inline int dbwrap_py_wipe(struct db_context *db)
{
#if DBWRAP_PY_SAMBA_4_25_LAYOUT
	return dbwrap_wipe(db, (struct dbwrap_wipe_flags){ .wipe_default = true });
#else
	return dbwrap_wipe(db);
#endif
}
int dbwrap_check(struct db_context *db);
int dbwrap_get_seqnum(struct db_context *db);
int dbwrap_transaction_start(struct db_context *db);
NTSTATUS dbwrap_transaction_start_nonblock(struct db_context *db);
int dbwrap_transaction_commit(struct db_context *db);
int dbwrap_transaction_cancel(struct db_context *db);
/* copies the id only if idlen is large enough; returns its length */
size_t dbwrap_db_id(struct db_context *db, uint8_t *id, size_t idlen);
bool dbwrap_is_persistent(struct db_context *db);
const char *dbwrap_name(struct db_context *db);

/* loadparm, exported by libsmbconf.so.0 */
bool lp_parm_bool(int snum, const char *type, const char *option, bool def);
int lp_parm_int(int snum, const char *type, const char *option, int def);
bool lp_use_mmap(void);
void lp_dump(FILE *f, bool show_defaults, int maxtoprint); /* smb.conf syntax */

/*
 * "4.17.12-Debian", "4.22.11-Debian-4.22.11+dfsg-0+deb13u1": the running
 * Samba's SAMBA_VERSION_STRING, from libsmbconf.so.0 (its SAMBA_VERSION
 * subsystem, in 4.17 and 4.22 alike); smbd --version prints the same.
 */
const char *samba_version_string(void);

/* libsamba-errors.so.1 */
const char *nt_errstr(NTSTATUS nt_code);

/* libsamba-debug (looked up at run time, so the bridge also loads without it) */
typedef bool (*samba_dbghdrclass_fn)(int level, int cls, const char *location,
				     const char *func);
typedef bool (*samba_dbgtext_fn)(const char *fmt, ...);
typedef int (*samba_debuglevel_get_class_fn)(size_t idx);

#endif /* DBWRAP_PY_SAMBA_ABI_H */

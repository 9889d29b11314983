/*
 * tfrecord.h - TFRecord framing: reader and writer.
 *
 * A record is `uint64 length | uint32 masked_crc32c(length) | data |
 * uint32 masked_crc32c(data)`, little-endian. ZLIB and GZIP compress the
 * whole stream (not each record); concatenated gzip members are read as one
 * stream. Offsets in messages are byte offsets in the (decompressed) stream.
 */
#ifndef SG_TFRECORD_H
#define SG_TFRECORD_H

#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"

#define TFR_HEADER_BYTES 12
#define TFR_FOOTER_BYTES 4
#define TFR_PATH_MAX     4096

typedef enum TfrCompression { TFR_NONE = 0, TFR_ZLIB = 1, TFR_GZIP = 2 } TfrCompression;

/* Parses "" / "NONE" / "ZLIB" / "GZIP" (any case); SG_EINVAL otherwise. */
int tfr_compression_parse(const char *name, TfrCompression *out, SgError *err);

/* Maps `file://x` to `x` and `dbfs:/x` to `/dbfs/x`; other paths unchanged. */
int tfr_path_resolve(const char *path, char *out, size_t cap, SgError *err);

/* The 12-byte header and the 4-byte footer of a record. */
void tfr_header_encode(uint8_t out[TFR_HEADER_BYTES], uint64_t length);
void tfr_footer_encode(uint8_t out[TFR_FOOTER_BYTES], const uint8_t *data, size_t length);

/* Parses one record at the start of buf[0..len). Returns 1 with *data,
 * *data_len (pointing into buf) and *consumed set; 0 when len == 0 (clean
 * end); SG_ETRUNCATED when buf ends inside the record, SG_ECORRUPT on a CRC
 * mismatch. `offset` is buf's position in its stream, for messages. */
int tfr_parse_one(const uint8_t *buf, size_t len, uint64_t offset, int verify_crc,
                  const uint8_t **data, size_t *data_len, size_t *consumed, SgError *err);

/* Checks the masked CRC32C stored in the 4 bytes after data[0..len);
 * SG_ECORRUPT names `offset` (the record's) on a mismatch. */
int tfr_check_data_crc(const uint8_t *data, size_t len, uint64_t offset, SgError *err);

/* ---- reader ---- */

typedef struct TfrReader TfrReader;

/* Opens a file (path resolved with tfr_path_resolve). */
int tfr_reader_open(TfrReader **out, const char *path, TfrCompression comp, int verify_crc,
                    SgError *err);

/* Reads from memory that must outlive the reader; `name` appears in messages. */
int tfr_reader_open_memory(TfrReader **out, const uint8_t *buf, size_t len, TfrCompression comp,
                           int verify_crc, const char *name, SgError *err);

/* Next record: 1 with *data / *len valid until the next call, 0 at the clean
 * end of the stream, or a negative status. Messages name the file and the
 * byte offset of the record. */
int tfr_reader_next(TfrReader *r, const uint8_t **data, size_t *len, SgError *err);

/* ZLIB / GZIP readers: decode with `backend` (an SgInflateBackend of
 * record/inflate.h) instead of the one SPARKGRAD_INFLATE chose at open; only
 * before the first read. */
int tfr_reader_use_inflate(TfrReader *r, int backend, SgError *err);

/* Stream offset of the record last returned by tfr_reader_next. */
uint64_t tfr_reader_offset(const TfrReader *r);

/* 1 when the records tfr_reader_next returns stay valid (with their footer)
 * until the reader closes: plain memory and mapped plain files. */
int tfr_reader_stable(const TfrReader *r);

/* With defer set, tfr_reader_next still checks the length CRC but leaves the
 * data CRC to the caller (tfr_check_data_crc on the returned data, whose
 * footer follows it), e.g. to check it on another thread. */
void tfr_reader_defer_data_crc(TfrReader *r, int defer);
/* Stream offset of the next record (of the failing one after an error). */
uint64_t tfr_reader_position(const TfrReader *r);
const char *tfr_reader_name(const TfrReader *r);
void tfr_reader_close(TfrReader *r);

/* ---- writer ---- */

typedef struct TfrWriter TfrWriter;

/* Creates (or truncates) a file. */
int tfr_writer_open(TfrWriter **out, const char *path, TfrCompression comp, SgError *err);

/* Appends one record (buffered; whole records only). */
int tfr_writer_write(TfrWriter *w, const uint8_t *data, size_t len, SgError *err);

/* Hands every buffered byte to the OS; a compressed stream is sync-flushed, so
 * what is on disk always ends at a record boundary. */
int tfr_writer_flush(TfrWriter *w, SgError *err);

/* Finishes the stream and closes the file; frees w even on failure. */
int tfr_writer_close(TfrWriter *w, SgError *err);

#endif /* SG_TFRECORD_H */

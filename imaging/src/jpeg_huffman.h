// Internal: shardfeed's own entropy decoder for sequential (baseline) Huffman JPEG scans, put
// in place of libjpeg-turbo's `decode_mcu` for one image at a time. Everything else (markers,
// restart markers through libjpeg's marker reader, IDCT, upsampling, colour) stays libjpeg's.
//
// Why: entropy decoding is most of a region decode's time (docs/BENCHMARKS.md, issue 24), and
// libjpeg-turbo 2.1 decodes a scan with restart markers (every indexed record) on its slow path,
// one table lookup for the code and another step for its value bits. This decoder looks up code,
// run and value together for codes of up to kFastBits bits with their value bits, and refills
// its 64-bit bit buffer eight bytes at a time where no 0xFF is among them.
//
// Contract: on valid data the coefficients are exactly libjpeg's, and neither warns
// (tests/imaging/jpeg_huffman_test.cpp decodes with both in one decompressor and compares every
// pixel). On damaged data it never reads outside the source buffer or writes outside a block;
// it warns where libjpeg-turbo warns and stays silent where it is silent (data running into a
// marker; a code no table has, which libjpeg's fast path takes as 0 silently), so a strict
// decode accepts and refuses what it did before. The one difference: libjpeg reports data left
// between a segment's end and its marker ("N extraneous bytes before marker": padding before
// EOI, a desynchronised segment) only past what its read-ahead had buffered, 0-8 bytes by its
// schedule; ours reports 4 bytes or more (EndOfSegment), so for 1-8 bytes the two can differ. Two
// outputs differ: `FF FF 00` in damaged data (see the test). It takes a scan only when the
// source is jpeg_mem_src (one that may suspend stays libjpeg's). One FastHuffman serves one
// decompressor at a time (it sets the decompressor's client_data, which must be unused);
// not thread-safe, as the decompressor it serves is not.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
// clang-format off
#include <jpeglib.h>
// clang-format on

namespace shardfeed::imaging::internal {

// Whether JPEG decodes use FastHuffman where it applies: yes, unless the environment variable
// SHARDFEED_JPEG_ENTROPY is `libjpeg` when first asked (an escape hatch, and the "before" of
// bench/region_bench). Thread-safe; a change applies to the decodes that start after it.
bool UseFastHuffman();
void SetUseFastHuffman(bool use);

class FastHuffman {
 public:
  static constexpr int kFastBits = 10;  // codes plus value bits looked up at once

  // After jpeg_start_decompress, before the first scanline: takes over the entropy decoding of
  // `cinfo`'s scan when it is one sequential Huffman scan of 8-bit samples read from a memory
  // source (jpeg_mem_src), and returns whether it did; otherwise libjpeg's decoder stays.
  bool Install(j_decompress_ptr cinfo);

 private:
  struct Table {
    // Indexed by the next kFastBits bits. `fast`: (value << 16) | (run << 8) | bits for a code
    // whose value bits fit too (EOB: run 64; ZRL: run 15, value 0), 0 otherwise. `look`:
    // (code length << 8) | symbol for any code of at most kFastBits bits, 0 otherwise.
    int32_t fast[1 << kFastBits];
    uint16_t look[1 << kFastBits];
    int32_t maxcode[18];  // the largest code of each length, -1 if none (canonical decoding)
    int32_t valoffset[18];
    uint8_t huffval[256];
  };

  static boolean DecodeMcuThunk(j_decompress_ptr cinfo, JBLOCKROW* blocks);
  static bool Build(const JHUFF_TBL* htbl, bool dc, Table* t);

  struct Reader;

  void DecodeMcu(JBLOCKROW* blocks);
  bool Restart();
  void RefillSlow();    // to at least 57 bits, byte by byte: stuffing, markers, the data's end
  void EndOfSegment();  // after a segment's or the scan's last MCU: extraneous data, marker
  void SyncSource() {
    cinfo_->src->next_input_byte = pos_;
    cinfo_->src->bytes_in_buffer = static_cast<size_t>(end_ - pos_);
  }

  j_decompress_ptr cinfo_ = nullptr;
  // The bit reader: the next nbits_ bits of the scan are the top of buf_; the last pad_ of them
  // are zeros made up after the data ran into a marker (or the end), not data.
  uint64_t buf_ = 0;
  int nbits_ = 0;
  int pad_ = 0;
  bool at_marker_ = false;  // the data reached a marker (read into unread_marker): zeros follow
  const uint8_t* pos_ = nullptr;
  const uint8_t* end_ = nullptr;

  unsigned restarts_to_go_ = 0;
  bool bad_code_ = false;   // the MCU being decoded had a code no table holds
  uint64_t mcus_left_ = 0;  // in the scan
  unsigned last_dc_[MAX_COMPS_IN_SCAN] = {};
  // Per block of an MCU: its tables, component, and whether its DC / AC values are kept.
  const Table* dc_of_[D_MAX_BLOCKS_IN_MCU] = {};
  const Table* ac_of_[D_MAX_BLOCKS_IN_MCU] = {};
  int comp_of_[D_MAX_BLOCKS_IN_MCU] = {};
  bool dc_needed_[D_MAX_BLOCKS_IN_MCU] = {};
  bool ac_needed_[D_MAX_BLOCKS_IN_MCU] = {};
  Table dc_[NUM_HUFF_TBLS];
  Table ac_[NUM_HUFF_TBLS];
};

}  // namespace shardfeed::imaging::internal

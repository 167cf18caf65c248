// shardfeed's entropy decoder for sequential Huffman JPEG scans (see jpeg_huffman.h). Decoding
// follows ITU T.81 F.2.2 and libjpeg-turbo's jdhuff.c step for step where data is damaged: a
// code no table holds decodes as symbol 0 with a warning, data that runs into a marker is
// continued with zero bits and leaves the rest of its restart segment zero (grey).
#include "jpeg_huffman.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
// clang-format off
#include <jerror.h>
#include <jpegint.h>
// clang-format on

namespace shardfeed::imaging::internal {
namespace {

// Zigzag position -> natural (row-major) position, with room for the run a damaged block may
// add past 63 (up to 63 + 64 for an end-of-block entry); all of that lands on 63, as in libjpeg.
struct NaturalOrder {
  int at[64 + 80];
  constexpr NaturalOrder() : at() {
    constexpr int kZigzag[64] = {0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,
                                 12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13, 6,  7,  14, 21, 28,
                                 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51,
                                 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63};
    for (int i = 0; i < 64 + 80; ++i) at[i] = i < 64 ? kZigzag[i] : 63;
  }
};
constexpr NaturalOrder kNatural;

// F.2.2.1: the value of `s` bits `v`.
inline int Extend(uint32_t v, int s) {
  return v < (1u << (s - 1)) ? static_cast<int>(v) - (1 << s) + 1 : static_cast<int>(v);
}

inline bool HasFF(uint64_t w) {  // whether any byte of w is 0xFF
  const uint64_t x = ~w;
  return ((x - 0x0101010101010101ull) & ~x & 0x8080808080808080ull) != 0;
}

inline uint64_t LoadBigEndian(const uint8_t* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return __builtin_bswap64(w);
}

std::atomic<bool>& UseFlag() {
  static std::atomic<bool> use{[] {
    const char* v = std::getenv("SHARDFEED_JPEG_ENTROPY");
    return v == nullptr || std::strcmp(v, "libjpeg") != 0;
  }()};
  return use;
}

}  // namespace

bool UseFastHuffman() { return UseFlag().load(std::memory_order_relaxed); }
void SetUseFastHuffman(bool use) { UseFlag().store(use, std::memory_order_relaxed); }

bool FastHuffman::Build(const JHUFF_TBL* htbl, bool dc, Table* t) {
  // Canonical codes (C.2), as jpeg_make_d_derived_tbl makes them; false for a table libjpeg
  // would refuse (libjpeg then reports it itself).
  std::memset(t->fast, 0, sizeof(t->fast));
  std::memset(t->look, 0, sizeof(t->look));
  int count = 0;
  for (int l = 1; l <= 16; ++l) count += htbl->bits[l];
  if (count > 256) return false;
  std::memcpy(t->huffval, htbl->huffval, 256);
  uint32_t code = 0;
  int p = 0;
  for (int l = 1; l <= 16; ++l) {
    const int n = htbl->bits[l];
    if (n == 0) {
      t->maxcode[l] = -1;
    } else {
      t->valoffset[l] = p - static_cast<int>(code);
      for (int i = 0; i < n; ++i, ++p, ++code) {
        if (code >= (1u << l)) return false;
        const int sym = htbl->huffval[p];
        if (dc && sym > 15) return false;
        if (l > kFastBits) continue;
        const int run = dc ? 0 : sym >> 4, s = sym & 15;
        const int shift = kFastBits - l;
        for (uint32_t j = 0; j < (1u << shift); ++j) {
          const uint32_t index = (code << shift) | j;
          t->look[index] = static_cast<uint16_t>((l << 8) | sym);
          int32_t e = 0;
          if (s == 0) {
            // DC 0; ZRL; end of block. The decode loop writes their value 0 at k + run: a
            // place still 0 (the coefficient controller zeroes each block before decode_mcu,
            // and no later k lands there), or past 63, which lands on 63, written only at k 63.
            e = dc ? l : ((run == 15 ? 15 : 64) << 8) | l;
          } else if (l + s <= kFastBits) {
            const int value = Extend((index >> (shift - s)) & ((1u << s) - 1), s);
            e = static_cast<int32_t>(static_cast<uint32_t>(value) << 16) | (run << 8) | (l + s);
          }
          t->fast[index] = e;
        }
      }
      t->maxcode[l] = static_cast<int32_t>(code) - 1;
      if (code >= (1u << l)) return false;  // all ones is no code (C.2), as libjpeg checks
    }
    code <<= 1;
  }
  t->maxcode[17] = 0x7FFFFFFF;
  return true;
}

namespace {

// The fill_input_buffer of libjpeg's memory source (jpeg_mem_src): how Install tells one.
decltype(jpeg_source_mgr::fill_input_buffer) MemorySourceFill() {
  static const auto fill = [] {
    jpeg_decompress_struct c;
    jpeg_error_mgr e;
    c.err = jpeg_std_error(&e);
    jpeg_create_decompress(&c);
    static const unsigned char kSoi[2] = {0xFF, 0xD8};
    jpeg_mem_src(&c, kSoi, sizeof(kSoi));
    const auto f = c.src->fill_input_buffer;
    jpeg_destroy_decompress(&c);
    return f;
  }();
  return fill;
}

}  // namespace

bool FastHuffman::Install(j_decompress_ptr cinfo) {
  if (cinfo->src == nullptr || cinfo->src->fill_input_buffer != MemorySourceFill()) {
    return false;  // a source that may suspend: libjpeg's decoder handles suspension
  }
  if (cinfo->progressive_mode || cinfo->arith_code || cinfo->data_precision != 8 ||
      cinfo->inputctl == nullptr || cinfo->inputctl->has_multiple_scans || cinfo->Ss != 0 ||
      cinfo->Se != DCTSIZE2 - 1 || cinfo->Ah != 0 || cinfo->Al != 0 || cinfo->entropy == nullptr ||
      cinfo->comps_in_scan < 1 || cinfo->comps_in_scan > MAX_COMPS_IN_SCAN ||
      cinfo->blocks_in_MCU < 1 || cinfo->blocks_in_MCU > D_MAX_BLOCKS_IN_MCU) {
    return false;
  }
  bool dc_built[NUM_HUFF_TBLS] = {}, ac_built[NUM_HUFF_TBLS] = {};
  for (int ci = 0; ci < cinfo->comps_in_scan; ++ci) {
    const jpeg_component_info* comp = cinfo->cur_comp_info[ci];
    const int d = comp->dc_tbl_no, a = comp->ac_tbl_no;
    if (d < 0 || d >= NUM_HUFF_TBLS || a < 0 || a >= NUM_HUFF_TBLS) return false;
    if (!cinfo->dc_huff_tbl_ptrs[d] || !cinfo->ac_huff_tbl_ptrs[a]) return false;
    if (!dc_built[d] && !Build(cinfo->dc_huff_tbl_ptrs[d], true, &dc_[d])) return false;
    if (!ac_built[a] && !Build(cinfo->ac_huff_tbl_ptrs[a], false, &ac_[a])) return false;
    dc_built[d] = ac_built[a] = true;
    last_dc_[ci] = 0;
  }
  for (int b = 0; b < cinfo->blocks_in_MCU; ++b) {
    const int ci = cinfo->MCU_membership[b];
    if (ci < 0 || ci >= cinfo->comps_in_scan) return false;
    const jpeg_component_info* comp = cinfo->cur_comp_info[ci];
    comp_of_[b] = ci;
    dc_of_[b] = &dc_[comp->dc_tbl_no];
    ac_of_[b] = &ac_[comp->ac_tbl_no];
    dc_needed_[b] = comp->component_needed;
    ac_needed_[b] = comp->component_needed && comp->DCT_scaled_size > 1;  // 1/8: DC alone
  }
  cinfo_ = cinfo;
  cinfo->client_data = this;
  buf_ = 0;
  nbits_ = pad_ = 0;
  pos_ = cinfo->src->next_input_byte;
  end_ = pos_ + cinfo->src->bytes_in_buffer;
  at_marker_ = cinfo->unread_marker != 0;
  restarts_to_go_ = cinfo->restart_interval;
  mcus_left_ = static_cast<uint64_t>(cinfo->MCUs_per_row) * cinfo->MCU_rows_in_scan;
  cinfo->entropy->decode_mcu = DecodeMcuThunk;
  return true;
}

boolean FastHuffman::DecodeMcuThunk(j_decompress_ptr cinfo, JBLOCKROW* blocks) {
  auto* self = static_cast<FastHuffman*>(cinfo->client_data);
  if (cinfo->restart_interval != 0 && self->restarts_to_go_ == 0 && !self->Restart()) {
    return FALSE;
  }
  if (!cinfo->entropy->insufficient_data) self->DecodeMcu(blocks);
  if (cinfo->restart_interval != 0) --self->restarts_to_go_;
  if (--self->mcus_left_ == 0) self->EndOfSegment();
  self->SyncSource();
  return TRUE;
}

// The end of a segment's coded data (before a restart marker, or after the scan's last MCU):
// whole bytes of data left before the marker are extraneous. libjpeg-turbo reports them only
// past what its read-ahead had buffered (0 to 8 bytes, by its schedule: a byte or two of padding
// before EOI passes, six rarely do); ours buffers on another schedule, so the rule is fixed
// instead: kExtraneousBytes or more are reported, with libjpeg's warning and count, fewer pass.
// Either way the marker ends up read into unread_marker, where libjpeg's marker reader takes it.
// Past the end of the data (no marker) nothing is done: reading on reports the data's end.
void FastHuffman::EndOfSegment() {
  constexpr unsigned kExtraneousBytes = 4;
  unsigned count = static_cast<unsigned>((nbits_ > pad_ ? nbits_ - pad_ : 0) / 8);
  buf_ = 0;
  nbits_ = pad_ = 0;
  if (!at_marker_) {
    const uint8_t* p = pos_;
    for (;;) {
      while (p < end_ && *p != 0xFF) ++p, ++count;
      const uint8_t* q = p;
      while (q < end_ && *q == 0xFF) ++q;  // fill bytes
      if (q >= end_) return;
      if (*q != 0) {
        cinfo_->unread_marker = *q;
        pos_ = q + 1;
        at_marker_ = true;
        break;
      }
      count += 2;  // FF 00: a stuffed 0xFF, two bytes to the marker reader
      p = q + 1;
    }
  }
  if (count >= kExtraneousBytes) {
    WARNMS2(cinfo_, JWRN_EXTRANEOUS_DATA, count, cinfo_->unread_marker);
  }
}

// What libjpeg's process_restart does after the segment's end: read the RSTn marker through
// libjpeg's marker reader (which warns about and resynchronises on a missing or wrong one),
// reset the DC predictions.
bool FastHuffman::Restart() {
  EndOfSegment();
  SyncSource();
  if (!(*cinfo_->marker->read_restart_marker)(cinfo_)) return false;
  for (int ci = 0; ci < cinfo_->comps_in_scan; ++ci) last_dc_[ci] = 0;
  restarts_to_go_ = cinfo_->restart_interval;
  pos_ = cinfo_->src->next_input_byte;
  end_ = pos_ + cinfo_->src->bytes_in_buffer;
  at_marker_ = cinfo_->unread_marker != 0;
  if (!at_marker_) cinfo_->entropy->insufficient_data = FALSE;
  return true;
}

void FastHuffman::RefillSlow() {
  while (nbits_ <= 56) {
    uint32_t c = 0;
    if (at_marker_) {
      pad_ += 8;
    } else if (pos_ >= end_) {
      // As libjpeg: ask the source (a memory source warns and supplies an end-of-image marker).
      SyncSource();
      if (!(*cinfo_->src->fill_input_buffer)(cinfo_) || cinfo_->src->bytes_in_buffer == 0) {
        at_marker_ = true;
      } else {
        pos_ = cinfo_->src->next_input_byte;
        end_ = pos_ + cinfo_->src->bytes_in_buffer;
      }
      continue;
    } else if (*pos_ != 0xFF) {
      c = *pos_++;
    } else {
      const uint8_t* p = pos_ + 1;
      while (p < end_ && *p == 0xFF) ++p;  // fill bytes
      if (p >= end_) {
        pos_ = p;  // the marker's code is past the data: ask the source, as libjpeg does
        continue;
      }
      if (*p == 0) {
        c = 0xFF;  // a stuffed 0xFF
        pos_ = p + 1;
      } else {
        // A marker: read, and left for the marker reader as libjpeg leaves it (unread_marker),
        // so what the read-ahead passed over is never reported as skipped, as in libjpeg.
        cinfo_->unread_marker = *p;
        pos_ = p + 1;
        at_marker_ = true;
        pad_ += 8;
      }
    }
    buf_ |= static_cast<uint64_t>(c) << (56 - nbits_);
    nbits_ += 8;
  }
}

// The bit reader's state in locals for one MCU (the members would go through memory after
// every coefficient stored), written back around the rare slow refill and at the end.
struct FastHuffman::Reader {
  FastHuffman& self;
  uint64_t buf;
  int nbits;
  const uint8_t* pos;

  explicit Reader(FastHuffman& f) : self(f), buf(f.buf_), nbits(f.nbits_), pos(f.pos_) {}
  void Save() const {
    self.buf_ = buf;
    self.nbits_ = nbits;
    self.pos_ = pos;
  }
  uint32_t Peek(int n) const { return static_cast<uint32_t>(buf >> (64 - n)); }
  void Consume(int n) {
    buf <<= n;
    nbits -= n;
  }
  // At least 32 bits in the buffer afterwards (zeros past a marker or the end of the data).
  void Fill() {
    if (nbits >= 32) return;
    if (self.end_ - pos >= 8 && !self.at_marker_) {
      const uint64_t w = LoadBigEndian(pos);
      if (!HasFF(w)) {
        // Whole bytes that fit; the part of the next byte that also lands in buf is that
        // byte's own bits, so taking the byte later ORs the same bits again.
        buf |= w >> nbits;
        pos += (63 - nbits) >> 3;
        nbits += ((63 - nbits) >> 3) * 8;
        return;
      }
    }
    Save();
    self.RefillSlow();
    buf = self.buf_, nbits = self.nbits_, pos = self.pos_;
  }
  // One symbol of table `t`; at least 32 bits are in the buffer.
  int Symbol(const Table& t) {
    const int e = t.look[Peek(kFastBits)];
    if (e != 0) {
      Consume(e >> 8);
      return e & 0xFF;
    }
    for (int l = kFastBits + 1; l <= 16; ++l) {
      const int32_t code = static_cast<int32_t>(Peek(l));
      if (code <= t.maxcode[l]) {
        Consume(l);
        return t.huffval[(code + t.valoffset[l]) & 0xFF];
      }
    }
    self.bad_code_ = true;  // no code of any length: a zero, as libjpeg gives (DecodeMcu warns)
    Consume(17);            // libjpeg reads one bit past the longest code before it gives up
    return 0;
  }
  // A value of s > 0 bits (F.2.2.1); at least s bits are in the buffer.
  int Value(int s) {
    const int v = Extend(Peek(s), s);
    Consume(s);
    return v;
  }
};

void FastHuffman::DecodeMcu(JBLOCKROW* blocks) {
  // Where libjpeg-turbo would decode this MCU on its fast path (no restart interval, 512 bytes a
  // block ahead, no marker reached), it takes a code no table has as 0 without a warning; its
  // slow path warns. Ours does the same, so strict decodes refuse what they refused before.
  const bool libjpeg_fast =
      cinfo_->restart_interval == 0 && !at_marker_ &&
      static_cast<size_t>(end_ - pos_) >= size_t{512} * static_cast<size_t>(cinfo_->blocks_in_MCU);
  bad_code_ = false;
  Reader r(*this);
  for (int b = 0; b < cinfo_->blocks_in_MCU; ++b) {
    JCOEF* block = blocks ? blocks[b][0] : nullptr;
    // F.2.2.1: the DC difference.
    r.Fill();
    const Table& dc = *dc_of_[b];
    int diff;
    const int32_t e = dc.fast[r.Peek(kFastBits)];
    if (e != 0) {
      diff = e >> 16;
      r.Consume(e & 0x1F);
    } else {
      const int s = r.Symbol(dc);
      diff = s != 0 ? r.Value(s) : 0;
    }
    if (dc_needed_[b]) {
      // Unsigned, as libjpeg: crafted differences may run the sum past 32 bits.
      const unsigned dcv = last_dc_[comp_of_[b]] + static_cast<unsigned>(diff);
      last_dc_[comp_of_[b]] = dcv;
      if (block) block[0] = static_cast<JCOEF>(dcv);
    }
    // F.2.2.2: the AC coefficients, run-length coded in zigzag order.
    const Table& ac = *ac_of_[b];
    JCOEF scratch[DCTSIZE2];
    JCOEF* out = ac_needed_[b] && block != nullptr ? block : scratch;
    for (int k = 1; k < DCTSIZE2;) {
      r.Fill();
      const int32_t f = ac.fast[r.Peek(kFastBits)];
      if (f != 0) {
        k += (f >> 8) & 0xFF;
        out[kNatural.at[k]] = static_cast<JCOEF>(f >> 16);
        r.Consume(f & 0x1F);
        ++k;
        continue;
      }
      const int sym = r.Symbol(ac);
      const int run = sym >> 4, s = sym & 15;
      if (s != 0) {
        k += run;
        out[kNatural.at[k]] = static_cast<JCOEF>(r.Value(s));
        ++k;
      } else if (run == 15) {
        k += 16;
      } else {
        break;
      }
    }
  }
  r.Save();
  if (bad_code_ && (!libjpeg_fast || at_marker_)) WARNMS(cinfo_, JWRN_HUFF_BAD_CODE);
  if (nbits_ < pad_) {
    // The MCU needed bits past the data's end: the rest of this segment stays zero.
    pad_ = nbits_;
    if (!cinfo_->entropy->insufficient_data) {
      WARNMS(cinfo_, JWRN_HIT_MARKER);
      cinfo_->entropy->insufficient_data = TRUE;
    }
  }
}

}  // namespace shardfeed::imaging::internal

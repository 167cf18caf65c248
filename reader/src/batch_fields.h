// Fields beside images and labels (LoaderOptions::fields; internal to the loader). A sample's
// fields take three routes, chosen once per loader (PlanFields):
//   - fixed-size fields (columns: int64, float32, float64, fixed arrays) are copied by the
//     worker that decodes the sample from the shard's column into a stacked region of the slot
//     (N x item bytes, pinned like the images);
//   - masks are decompressed by that worker and resampled with the image's geometry
//     (geometry.h, nearest neighbour) into a stacked N x H x W uint8 region of the slot;
//   - variable fields (boxes, per-box fields, arrays with a "*" dim, str, bytes, json) are
//     gathered by the consumer in Next() (GatherFields), from the archive's mapping into
//     host buffers of the slot's own (reused with the slot, never freed per batch): boxes mapped
//     into output pixels with the geometry the worker recorded and filtered together with the
//     rows of every field declared per those boxes.
// The worker also checks the sample's var blob (its checksum when the transform verifies
// checksums, and the structure of every selected variable field), so whatever the consumer
// gathers has been checked, and a damaged sample is that sample's error like a damaged image.
// Every route runs in thread and process mode alike (a worker process plans from the same
// selection, sent in its configuration). With no field selected none of this runs: the slot
// layout and the per-sample work are exactly those of image + label.
#pragma once

#include <cstdint>
#include <vector>

#include "batch_ring.h"
#include "shardfeed/format/archive.h"
#include "shardfeed/reader/geometry.h"
#include "shardfeed/reader/loader.h"

namespace shardfeed::reader {

struct FieldPlan {
  enum class Where : uint8_t { kColumn, kMask, kRagged };
  struct Item {
    int field = -1;  // schema index
    Where where = Where::kRagged;
    size_t item_bytes = 0;  // kColumn: per sample; kMask: out_h * out_w
    int region = -1;        // kColumn, kMask: its stacked region of the slot
    int boxes = -1;         // boxes fields and per-box fields: the boxes field they follow
  };
  uint64_t selected = 0;             // bit f: schema field f (never the image or class field)
  std::vector<Item> items;           // in schema order
  std::vector<size_t> region_bytes;  // per-sample bytes of the slot's stacked regions
  std::vector<int> box_fields;       // boxes fields the consumer maps (selected or followed)
  bool blob = false;                 // an item lives in the var blob: workers check it
  bool ragged = false;               // the consumer gathers
  uint32_t out_h = 0, out_w = 0;     // the images' (and masks') output size
  bool empty() const { return items.empty(); }
};

// LoaderOptions::fields resolved against `schema`: bit f for each field named (every field
// with all_fields), the image and the class field left out (they come as images and labels).
// kInvalidArgument naming an unknown field, the closest name and the schema's fields.
Result<uint64_t> SelectFields(const format::Schema& schema, const LoaderOptions& options);
FieldPlan PlanFields(const format::Schema& schema, uint64_t selected, uint32_t out_h,
                     uint32_t out_w);

// Where a sample's SampleGeometry is in a slot laid out with `layout`.
inline SampleGeometry* SlotGeometry(uint8_t* slot, const SlotLayout& layout, uint32_t position) {
  return reinterpret_cast<SampleGeometry*>(slot + layout.geometry_offset) + position;
}

// A worker's part (one per worker; not thread-safe).
class FieldWriter {
 public:
  FieldWriter(const format::Archive& archive, const FieldPlan& plan, const SlotLayout& layout,
              bool verify)
      : archive_(archive), plan_(plan), layout_(layout), verify_(verify) {}
  // After sample `index`'s image was placed with geometry `g`: its fixed fields and masks into
  // the slot at `slot`, its geometry recorded, its var blob checked. Errors name the archive,
  // the sample and the field; the caller then clears the position (Clear) or fails the batch.
  Status Write(uint64_t index, const SampleGeometry& g, uint8_t* slot, uint32_t position);
  // A skipped sample: zero fields, no geometry (the consumer gathers nothing for it).
  static void Clear(const FieldPlan& plan, const SlotLayout& layout, uint8_t* slot,
                    uint32_t position);

 private:
  const format::Archive& archive_;
  const FieldPlan& plan_;
  const SlotLayout& layout_;
  bool verify_;
  std::vector<uint8_t> mask_;  // a stored mask, decompressed
};

// The consumer's part, one per slot: the Batch's field views and the host buffers its variable
// fields live in (reused whenever the slot is; written only by the consumer's thread, while
// no lease of the slot is out).
struct SlotFields {
  struct Buffer {
    std::vector<uint8_t> values;
    std::vector<int64_t> offsets;
    std::vector<uint32_t> dims;
  };
  std::vector<BatchField> views;  // Batch::fields()
  std::vector<Buffer> buffers;    // per kRagged item
  std::vector<std::vector<float>> boxes;
  std::vector<std::vector<uint32_t>> rows;
};

// Fills `out` for the `count` samples of the slot at `slot` (indices as the workers wrote
// them). Errors name the archive, the sample and the field.
Status GatherFields(const format::Archive& archive, const FieldPlan& plan, const SlotLayout& layout,
                    uint8_t* slot, uint32_t count, SlotFields* out);

}  // namespace shardfeed::reader

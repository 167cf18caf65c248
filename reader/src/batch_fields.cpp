// Fields beside images and labels (batch_fields.h): the plan, the workers' part, the
// consumer's part.
#include "batch_fields.h"

#include <algorithm>
#include <cstring>

#include "shardfeed/base/option_text.h"

namespace shardfeed::reader {

using format::FieldKind;
using format::FieldSpec;
using format::FieldView;
using format::Schema;

Result<uint64_t> SelectFields(const Schema& schema, const LoaderOptions& options) {
  const auto carried = [&](int f) {
    return f != schema.image_field() && f != schema.label_field();
  };
  uint64_t bits = 0;
  if (options.all_fields) {
    for (size_t f = 0; f < schema.size(); ++f) {
      const FieldSpec& spec = schema.fields()[f];
      const bool source_path = spec.name == "path" && spec.kind == FieldKind::kStr;
      if (source_path && !options.source_path_too) continue;  // asked for by name or "*"
      if (carried(static_cast<int>(f))) bits |= uint64_t{1} << f;
    }
    return bits;
  }
  std::vector<std::string> names;
  for (const FieldSpec& spec : schema.fields()) names.push_back(spec.name);
  for (const std::string& name : options.fields) {
    const int f = schema.Find(name);
    if (f < 0) {
      std::string all;
      for (const std::string& n : names) all += (all.empty() ? "" : ", ") + n;
      const std::string close = ClosestName(name, names);
      return Status::InvalidArgument(
          "fields (--fields): the archive has no field '", name, "'",
          close.empty() ? std::string() : "; did you mean '" + close + "'?", " (its fields: ", all,
          ")");
    }
    if (carried(f)) bits |= uint64_t{1} << f;
  }
  return bits;
}

FieldPlan PlanFields(const Schema& schema, uint64_t selected, uint32_t out_h, uint32_t out_w) {
  FieldPlan plan;
  plan.selected = selected;
  plan.out_h = out_h;
  plan.out_w = out_w;
  std::vector<bool> follow(schema.size(), false);  // boxes fields whose survivors matter
  for (size_t f = 0; f < schema.size() && f < 64; ++f) {
    if (!(selected >> f & 1)) continue;
    const FieldSpec& spec = schema.fields()[f];
    FieldPlan::Item item;
    item.field = static_cast<int>(f);
    if (spec.kind == FieldKind::kMask) {
      item.where = FieldPlan::Where::kMask;
      item.item_bytes = size_t{out_h} * out_w;
    } else if (spec.fixed()) {
      item.where = FieldPlan::Where::kColumn;
      item.item_bytes = spec.item_bytes();
    }
    if (item.where != FieldPlan::Where::kRagged) {
      item.region = static_cast<int>(plan.region_bytes.size());
      plan.region_bytes.push_back(item.item_bytes);
    } else {
      plan.ragged = true;
      if (spec.kind == FieldKind::kBoxes) item.boxes = static_cast<int>(f);
      if (!spec.per.empty()) item.boxes = schema.Find(spec.per);
      if (item.boxes >= 0) follow[item.boxes] = true;
    }
    if (item.where != FieldPlan::Where::kColumn) plan.blob = true;
    plan.items.push_back(item);
  }
  for (size_t f = 0; f < follow.size(); ++f) {
    if (follow[f]) plan.box_fields.push_back(static_cast<int>(f));
  }
  return plan;
}

// ---- The workers' part -------------------------------------------------------------------------

void FieldWriter::Clear(const FieldPlan& plan, const SlotLayout& layout, uint8_t* slot,
                        uint32_t position) {
  for (const FieldPlan::Item& item : plan.items) {
    if (item.region < 0) continue;
    std::memset(slot + layout.region_offsets[item.region] + position * item.item_bytes, 0,
                item.item_bytes);
  }
  *SlotGeometry(slot, layout, position) = SampleGeometry();
}

Status FieldWriter::Write(uint64_t index, const SampleGeometry& g, uint8_t* slot,
                          uint32_t position) {
  const Schema& schema = archive_.schema();
  bool checked = !verify_;  // the var blob's checksum, checked once per sample
  for (const FieldPlan::Item& item : plan_.items) {
    const FieldSpec& spec = schema.fields()[item.field];
    const bool in_blob = item.where != FieldPlan::Where::kColumn;
    SF_ASSIGN_OR_RETURN(FieldView view, archive_.Field(index, static_cast<size_t>(item.field),
                                                       in_blob && !checked));
    if (in_blob) checked = true;
    auto bad = [&](const std::string& why) {
      return Status::Corrupt(archive_.path(), ": sample ", index, ": field '", spec.name,
                             "': ", why);
    };
    if (item.where == FieldPlan::Where::kColumn) {
      if (view.size != item.item_bytes) return bad("column value of the wrong size");
      std::memcpy(slot + layout_.region_offsets[item.region] + position * item.item_bytes,
                  view.data, item.item_bytes);
      continue;
    }
    // What the writers refuse (a mask of another size, text that is not UTF-8, JSON past its
    // depth, non-finite boxes: a crafted archive) fails here, on the worker, as a sample error
    // skip_errors can skip, rather than as a Python exception where the batch's field is read.
    // JSON's syntax is left to the consumer (format::ValueChecks: a parse costs 10x the read).
    if (Status s = format::CheckStoredValue(spec, view, g.stored_height, g.stored_width, -1,
                                            /*json_syntax=*/false);
        !s.ok()) {
      return Status::Corrupt(archive_.path(), ": sample ", index, ": ", s.message());
    }
    if (item.where == FieldPlan::Where::kMask) {
      mask_.resize(size_t{g.stored_height} * g.stored_width);
      if (Status s = format::DecodeMask(view, mask_.data()); !s.ok()) return bad(s.message());
      MapMask(g, mask_.data(),
              slot + layout_.region_offsets[item.region] + position * item.item_bytes);
    } else if (item.boxes >= 0 && item.boxes != item.field) {
      // A per-box field: as many rows as its boxes (the consumer filters them together).
      SF_ASSIGN_OR_RETURN(FieldView boxes,
                          archive_.Field(index, static_cast<size_t>(item.boxes), false));
      if (view.ndim == 0 || boxes.ndim == 0 || view.dims[0] != boxes.dims[0]) {
        return bad("its rows differ from those of '" + spec.per + "'");
      }
    }
  }
  *SlotGeometry(slot, layout_, position) = g;
  return Status::OK();
}

// ---- The consumer's part -----------------------------------------------------------------------

namespace {

// Whether a variable field's values are counted in rows (boxes, arrays whose only "*" dim is the
// first: float32[*,4], int64[*]) or in elements (other arrays) or bytes (str, bytes, json).
bool ByRows(const FieldSpec& spec) {
  if (spec.kind == FieldKind::kBoxes) return true;
  if (spec.kind != FieldKind::kArray || spec.dims.empty() || spec.dims[0] != format::kAnyDim) {
    return false;
  }
  for (size_t d = 1; d < spec.dims.size(); ++d) {
    if (spec.dims[d] == format::kAnyDim) return false;
  }
  return true;
}

// Bytes of one entry of a variable field's values (an offset counts these).
size_t UnitBytes(const FieldSpec& spec) {
  if (spec.kind == FieldKind::kStr || spec.kind == FieldKind::kBytes ||
      spec.kind == FieldKind::kJson) {
    return 1;
  }
  if (spec.kind == FieldKind::kBoxes) return 4 * sizeof(float);
  size_t unit = format::ElemSize(spec.elem);
  if (ByRows(spec)) {
    for (size_t d = 1; d < spec.dims.size(); ++d) unit *= static_cast<size_t>(spec.dims[d]);
  }
  return unit;
}

format::ElemType ElemOf(const FieldSpec& spec) {
  if (spec.kind == FieldKind::kStr || spec.kind == FieldKind::kBytes ||
      spec.kind == FieldKind::kJson) {
    return format::ElemType::kUint8;
  }
  if (spec.kind == FieldKind::kBoxes) return format::ElemType::kFloat32;
  return spec.elem;
}

void Append(std::vector<uint8_t>* v, const void* data, size_t bytes) {
  const size_t at = v->size();
  v->resize(at + bytes);
  if (bytes) std::memcpy(v->data() + at, data, bytes);
}

// The views of a gathered batch: stacked regions in the slot, ragged ones in the buffers.
void PointViews(const Schema& schema, const FieldPlan& plan, const SlotLayout& layout,
                uint8_t* slot, uint32_t count, SlotFields* out) {
  out->views.resize(plan.items.size());
  size_t k = 0;
  for (size_t x = 0; x < plan.items.size(); ++x) {
    const FieldPlan::Item& item = plan.items[x];
    const FieldSpec& spec = schema.fields()[item.field];
    BatchField& v = out->views[x];
    v.name = spec.name;
    v.kind = spec.kind;
    v.elem = ElemOf(spec);
    v.shape.assign(1, count);
    if (item.where != FieldPlan::Where::kRagged) {
      v.data = slot + layout.region_offsets[item.region];
      v.bytes = item.item_bytes * count;
      v.offsets = nullptr, v.dims = nullptr, v.ndim = 0;
      if (item.where == FieldPlan::Where::kMask) {
        v.shape.push_back(plan.out_h);
        v.shape.push_back(plan.out_w);
      } else {
        for (int64_t d : spec.dims) v.shape.push_back(d);
      }
      continue;
    }
    const SlotFields::Buffer& buf = out->buffers[k++];
    const size_t unit = UnitBytes(spec);
    v.data = buf.values.data();
    v.bytes = buf.values.size();
    v.offsets = buf.offsets.data();
    v.ndim = static_cast<uint32_t>(spec.stored_dims());
    v.dims = buf.dims.data();
    v.shape.assign(1, static_cast<int64_t>(buf.values.size() / unit));
    if (ByRows(spec)) {
      for (size_t d = 1; d < spec.dims.size(); ++d) v.shape.push_back(spec.dims[d]);
    }
  }
}

}  // namespace

Status GatherFields(const format::Archive& archive, const FieldPlan& plan, const SlotLayout& layout,
                    uint8_t* slot, uint32_t count, SlotFields* out) {
  const Schema& schema = archive.schema();
  const auto* indices = reinterpret_cast<const uint64_t*>(slot + layout.indices_offset);
  const SampleGeometry* geometry = SlotGeometry(slot, layout, 0);
  size_t ragged = 0;
  for (const FieldPlan::Item& item : plan.items) ragged += item.where == FieldPlan::Where::kRagged;
  out->buffers.resize(ragged);
  out->boxes.resize(schema.size());
  out->rows.resize(schema.size());
  for (auto& b : out->buffers) {
    b.values.clear();
    b.dims.clear();
    b.offsets.assign(1, 0);
  }
  for (uint32_t i = 0; i < count; ++i) {
    const uint64_t index = indices[i];
    const SampleGeometry& g = geometry[i];
    // Boxes first: their survivors decide the rows of every field per them.
    for (int b : plan.box_fields) {
      out->boxes[b].clear();
      out->rows[b].clear();
      if (!g.valid) continue;
      SF_ASSIGN_OR_RETURN(FieldView v, archive.Field(index, static_cast<size_t>(b), false));
      const size_t n = v.ndim ? v.dims[0] : 0;
      out->boxes[b].resize(4 * n);
      out->rows[b].resize(n);
      const size_t kept = MapBoxes(g, v.data, n, out->boxes[b].data(), out->rows[b].data());
      out->boxes[b].resize(4 * kept);
      out->rows[b].resize(kept);
    }
    size_t k = 0;
    for (const FieldPlan::Item& item : plan.items) {
      if (item.where != FieldPlan::Where::kRagged) continue;
      SlotFields::Buffer& buf = out->buffers[k++];
      const FieldSpec& spec = schema.fields()[item.field];
      const size_t unit = UnitBytes(spec);
      const size_t nd = spec.stored_dims();
      const size_t before = buf.values.size();
      if (!g.valid) {  // a skipped sample: no rows, no bytes
        for (size_t d = 0; d < nd; ++d) {
          const int64_t want = d < spec.dims.size() ? spec.dims[d] : 0;
          buf.dims.push_back(d > 0 && want > 0 ? static_cast<uint32_t>(want) : 0);
        }
      } else if (item.boxes == item.field) {
        const std::vector<float>& kept = out->boxes[item.field];
        Append(&buf.values, kept.data(), kept.size() * sizeof(float));
        buf.dims.push_back(static_cast<uint32_t>(kept.size() / 4));
        buf.dims.push_back(4);
      } else {
        SF_ASSIGN_OR_RETURN(FieldView v, archive.Field(index, static_cast<size_t>(item.field)));
        if (item.boxes >= 0) {
          const std::vector<uint32_t>& rows = out->rows[item.boxes];
          const size_t n = v.ndim ? v.dims[0] : 0;
          const size_t row = n ? v.size / n : 0;
          for (uint32_t r : rows) {
            if (r < n) Append(&buf.values, v.data + r * row, row);
          }
          buf.dims.push_back(static_cast<uint32_t>(rows.size()));
          for (size_t d = 1; d < nd; ++d) buf.dims.push_back(v.dims[d]);
        } else {
          Append(&buf.values, v.data, v.size);
          for (size_t d = 0; d < nd; ++d) buf.dims.push_back(v.dims[d]);
        }
      }
      buf.offsets.push_back(buf.offsets.back() +
                            static_cast<int64_t>((buf.values.size() - before) / unit));
    }
  }
  PointViews(schema, plan, layout, slot, count, out);
  return Status::OK();
}

}  // namespace shardfeed::reader

// COCO instances files: one sample per image (in the file's order), its annotations as boxes
// with per-box labels (0..K-1), iscrowd and the file's own category ids, captions from a COCO
// captions file. Masks (segmentation polygons/RLE) are not imported.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "shardfeed/converter/importers.h"

namespace shardfeed::converter {
namespace {

using Json = nlohmann::json;

Result<Json> ReadJson(const std::string& file, const char* what) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return Status::NotFound(file, ": cannot open ", what, ": ", std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::IOError(file, ": read failed");
  if (!Json::accept(text.str())) {
    return Status::Corrupt(file, ": not valid JSON: ", JsonSyntaxError(text.str()));
  }
  const Status exact = CheckJsonText(text.str());  // before the parse: its depth
  if (!exact.ok()) return Status::Corrupt(file, ": ", exact.message());
  Json j = Json::parse(text.str(), nullptr, false);
  if (!j.is_object()) return Status::Corrupt(file, ": not a JSON object");
  return j;
}

// An integer id (COCO's are numbers; some exporters write whole floats): one that an int64
// holds exactly, or none (an unsigned one past INT64_MAX used to wrap to a negative id, and a
// float past 2^53 to be rounded or cast out of range).
bool IdOf(const Json& j, const char* key, int64_t* id) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return false;
  if (it->is_number_unsigned()) {
    if (it->get<uint64_t>() > uint64_t{INT64_MAX}) return false;
    *id = static_cast<int64_t>(it->get<uint64_t>());
    return true;
  }
  if (it->is_number_integer()) return *id = it->get<int64_t>(), true;
  const double d = it->get<double>();
  if (d != std::floor(d) || std::fabs(d) > 9007199254740992.0) return false;
  *id = static_cast<int64_t>(d);
  return true;
}

// An image's "width" and "height": both absent, null or 0 (0 x 0: not declared, as exporters
// write an unknown size), or both whole numbers from 1 to 2^32 - 1. Anything else (a string,
// 100.5, -1) is refused for an image with boxes: it was taken as "not declared", so an
// EXIF-turned photo's upright boxes were turned a second time without a word.
Status DeclaredSize(const Json& image, uint32_t* width, uint32_t* height) {
  auto unknown = [&](const char* key) {
    auto it = image.find(key);
    return it == image.end() || it->is_null() || (it->is_number() && it->get<double>() == 0);
  };
  if (unknown("width") && unknown("height")) return Status::OK();
  const bool has_w = image.contains("width"), has_h = image.contains("height");
  int64_t w = 0, h = 0;
  if (!has_w || !has_h || !IdOf(image, "width", &w) || !IdOf(image, "height", &h) || w < 1 ||
      h < 1 || w > int64_t{UINT32_MAX} || h > int64_t{UINT32_MAX}) {
    return Status::InvalidArgument(
        "\"width\": ", has_w ? image["width"].dump() : std::string("(none)"),
        ", \"height\": ", has_h ? image["height"].dump() : std::string("(none)"),
        " is not a size in pixels (two whole numbers of at least 1; leave both out for an "
        "image whose size is unknown)");
  }
  if (width) *width = static_cast<uint32_t>(w), *height = static_cast<uint32_t>(h);
  return Status::OK();
}

struct PerImage {
  std::vector<float> boxes;
  std::vector<int64_t> labels, iscrowd, category_ids;
  Json captions = Json::array();
};

// Categories in id order -> contiguous labels 0..K-1 (the map from COCO's ids), their names
// the class names (list->class_names, made unique), with notes for what was made up.
Result<std::unordered_map<int64_t, int64_t>> ReadCategories(const Json& coco,
                                                            const std::string& file,
                                                            SourceList* list) {
  std::vector<std::pair<int64_t, std::string>> categories;
  size_t unnamed = 0;
  if (coco.contains("categories")) {
    for (size_t i = 0; i < coco["categories"].size(); ++i) {
      const Json& c = coco["categories"][i];
      int64_t id;
      if (!c.is_object() || !IdOf(c, "id", &id)) {
        return Status::Corrupt(file, ": categories[", i, "]: field 'id': not an integer");
      }
      auto name = c.find("name");
      if (name != c.end() && !name->is_string()) {
        return Status::Corrupt(file, ": categories[", i, "]: \"name\" is ", name->type_name(),
                               ", not text");
      }
      unnamed += name == c.end();
      categories.push_back({id, name != c.end() ? name->get<std::string>() : std::to_string(id)});
    }
  }
  if (unnamed > 0) {
    list->notes.push_back(file + ": " + std::to_string(unnamed) +
                          " categories have no \"name\": their class names are their ids");
  }
  std::sort(categories.begin(), categories.end());
  std::unordered_map<int64_t, int64_t> label_of;
  std::unordered_map<std::string, int64_t> first_with_name;
  std::vector<std::string> renamed;
  for (size_t i = 0; i < categories.size(); ++i) {
    if (!label_of.emplace(categories[i].first, int64_t(i)).second) {
      return Status::Corrupt(file, ": categories: id ", categories[i].first, " given twice");
    }
    // Class names are unique in an archive (the Writer refuses a repeat, and extract would
    // merge the two into one folder): a repeated name gets its id added.
    std::string name = categories[i].second;
    // Every name given so far is taken, the added ones too (another category may be called
    // "dog (id 3)" already): more is added until the name is free.
    for (int k = 0; !first_with_name.emplace(name, categories[i].first).second; ++k) {
      name = categories[i].second + " (id " + std::to_string(categories[i].first) +
             (k ? ", " + std::to_string(k + 1) : std::string()) + ")";
    }
    if (name != categories[i].second) {
      renamed.push_back("'" + categories[i].second + "' id " + std::to_string(categories[i].first) +
                        " -> '" + name + "'");
    }
    list->class_names.push_back(name);
  }
  if (!renamed.empty()) {
    std::string which;
    for (size_t k = 0; k < renamed.size() && k < 5; ++k) which += (k ? ", " : "") + renamed[k];
    list->notes.push_back(file + ": " + std::to_string(renamed.size()) +
                          " categories repeat an earlier category's name; class names are unique, "
                          "so their ids were added (" +
                          which + (renamed.size() > 5 ? ", ..." : "") + ")");
  }
  return label_of;
}

}  // namespace

// long: images, annotations, captions, then the items, in one place so each error
// can name the array element it comes from.
Result<SourceList> ImportCoco(const std::string& file, const ImportOptions& options) {
  if (options.images.empty()) {
    return Status::InvalidArgument(file, ": a COCO source needs --images DIR (the image folder)");
  }
  // A wrong --images is the command's mistake, not damage in the data: said once, up front
  // (not as one unreadable image per sample).
  struct stat st;
  if (::stat(options.images.c_str(), &st) != 0) {
    return Status::InvalidArgument("--images ", options.images, ": ", std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) {
    return Status::InvalidArgument("--images ", options.images, ": not a directory");
  }
  SF_ASSIGN_OR_RETURN(Json coco, ReadJson(file, "COCO annotations"));
  if (!coco.contains("images") || !coco["images"].is_array()) {
    return Status::Corrupt(file, ": no \"images\" list (not a COCO instances file)");
  }
  SourceList list;
  list.kind = "coco";
  list.root = options.images;
  auto bad = [&](const std::string& where, const std::string& why) -> Status {
    if (!options.skip_bad) return Status::Corrupt(file, ": ", where, ": ", why);
    list.skipped.push_back({file + ": " + where, why});
    return Status::OK();
  };
  // "categories" and "annotations", where present, are lists: another value was read as none.
  for (const char* key : {"categories", "annotations"}) {
    if (coco.contains(key) && !coco[key].is_array()) {
      return Status::Corrupt(file, ": \"", key, "\" is ", coco[key].type_name(), ", not a list");
    }
  }
  SF_ASSIGN_OR_RETURN(auto label_of, ReadCategories(coco, file, &list));
  // Images, in the file's order.
  const Json& images = coco["images"];
  std::unordered_map<int64_t, size_t> image_of;
  std::vector<PerImage> per(images.size());
  std::vector<bool> usable(images.size(), true);
  for (size_t i = 0; i < images.size(); ++i) {
    int64_t id;
    const std::string where = "images[" + std::to_string(i) + "]";
    if (!images[i].is_object() || !IdOf(images[i], "id", &id)) {
      usable[i] = false;
      SF_RETURN_IF_ERROR(bad(where, "field 'image_id': no integer \"id\" (an int64, exact)"));
    } else if (!images[i].contains("file_name") || !images[i]["file_name"].is_string()) {
      usable[i] = false;
      SF_RETURN_IF_ERROR(bad(where, "field 'path': no \"file_name\""));
    } else if (images[i]["file_name"].get_ref<const std::string&>().find('\0') !=
                   std::string::npos ||
               images[i]["file_name"].get_ref<const std::string&>().empty()) {
      usable[i] = false;  // a NUL ended the path early: another file was read
      SF_RETURN_IF_ERROR(bad(where, "field 'path': \"file_name\" is empty or holds a NUL byte"));
    } else if (!image_of.emplace(id, i).second) {
      usable[i] = false;
      SF_RETURN_IF_ERROR(bad(where, "field 'image_id': id " + std::to_string(id) + " given twice"));
    }
  }
  // Annotations: xywh -> x0,y0,x1,y1, category -> label.
  size_t segmented = 0, keypoints = 0;
  if (coco.contains("annotations")) {
    const Json& anns = coco["annotations"];
    for (size_t i = 0; i < anns.size(); ++i) {
      const Json& a = anns[i];
      if (a.is_object()) {
        segmented += a.contains("segmentation") && !a["segmentation"].empty();
        keypoints += a.contains("keypoints") && !a["keypoints"].empty();
      }
      const std::string where = "annotations[" + std::to_string(i) + "]";
      int64_t image_id, category;
      if (!a.is_object() || !IdOf(a, "image_id", &image_id) || !image_of.count(image_id)) {
        SF_RETURN_IF_ERROR(bad(where, "field 'image_id': no image with this id"));
        continue;
      }
      if (!IdOf(a, "category_id", &category)) {
        SF_RETURN_IF_ERROR(bad(where, "field 'labels': category_id " +
                                          (a.contains("category_id") ? a["category_id"].dump()
                                                                     : std::string("(none)")) +
                                          " is not an integer"));
        continue;
      }
      if (!label_of.count(category)) {
        SF_RETURN_IF_ERROR(bad(where, "field 'labels': category_id " + std::to_string(category) +
                                          " not in \"categories\""));
        continue;
      }
      auto bbox = a.find("bbox");
      bool ok = bbox != a.end() && bbox->is_array() && bbox->size() == 4;
      for (size_t k = 0; ok && k < 4; ++k) {
        ok = (*bbox)[k].is_number() && std::isfinite((*bbox)[k].get<double>());
      }
      if (!ok) {
        SF_RETURN_IF_ERROR(bad(where, "field 'boxes': bbox is not 4 numbers [x, y, w, h]"));
        continue;
      }
      if ((*bbox)[2].get<double>() < 0 || (*bbox)[3].get<double>() < 0) {
        SF_RETURN_IF_ERROR(bad(where,
                               "field 'boxes': bbox [x, y, w, h] has a negative width or "
                               "height (an inverted box)"));
        continue;
      }
      int64_t crowd = 0;
      if (a.contains("iscrowd") && !IdOf(a, "iscrowd", &crowd)) {
        SF_RETURN_IF_ERROR(bad(where, "field 'iscrowd': not an integer"));
        continue;
      }
      PerImage& p = per[image_of[image_id]];
      const double x = (*bbox)[0], y = (*bbox)[1], w = (*bbox)[2], h = (*bbox)[3];
      p.boxes.insert(p.boxes.end(), {float(x), float(y), float(x + w), float(y + h)});
      p.labels.push_back(label_of[category]);
      p.iscrowd.push_back(crowd);
      p.category_ids.push_back(category);
    }
  }
  if (segmented + keypoints > 0) {
    list.notes.push_back(file + ": " + std::to_string(segmented) + " annotations with a " +
                         "\"segmentation\" and " + std::to_string(keypoints) + " with " +
                         "\"keypoints\": neither is imported (boxes, labels and iscrowd are)");
  }
  const bool captions = !options.captions.empty();
  if (captions) {
    SF_ASSIGN_OR_RETURN(Json caps, ReadJson(options.captions, "COCO captions"));
    if (!caps.contains("annotations") || !caps["annotations"].is_array()) {
      return Status::Corrupt(options.captions, ": no \"annotations\" list");
    }
    for (size_t i = 0; i < caps["annotations"].size(); ++i) {
      const Json& c = caps["annotations"][i];
      int64_t image_id = 0;
      std::string why;  // which of the two it lacks
      if (!c.is_object() || !IdOf(c, "image_id", &image_id)) {
        why = "field 'captions': no integer \"image_id\"";
      } else if (!image_of.count(image_id)) {
        why = "field 'captions': image_id " + std::to_string(image_id) + " is not among the " +
              "instances file's images";
      } else if (!c.contains("caption") || !c["caption"].is_string()) {
        why = "field 'captions': \"caption\" is not text";
      }
      if (!why.empty()) {
        if (!options.skip_bad) {
          return Status::Corrupt(options.captions, ": annotations[", i, "]: ", why);
        }
        list.skipped.push_back(
            {options.captions + ": annotations[" + std::to_string(i) + "]", why});
        continue;
      }
      per[image_of[image_id]].captions.push_back(c["caption"]);
    }
  }
  std::string schema_json =
      R"({"image": "image", "boxes": "boxes", "labels": {"type": "int64[*]", "per": "boxes"},
          "iscrowd": {"type": "int64[*]", "per": "boxes"},
          "category_id": {"type": "int64[*]", "per": "boxes"}, "image_id": "int64", "path": "str")";
  schema_json += captions ? R"(, "captions": "json"})" : "}";
  SF_ASSIGN_OR_RETURN(list.schema, format::Schema::FromJson(schema_json));
  list.path_field = true;
  for (size_t i = 0; i < images.size(); ++i) {
    if (!usable[i]) continue;
    PerImage& p = per[i];
    SourceItem item;
    const std::string name = images[i]["file_name"].get<std::string>();
    item.path = name[0] == '/' ? name : options.images + "/" + name;
    item.name = file + ": images[" + std::to_string(i) + "] (" + name + ")";
    // Checked against the image by the writer; 0 x 0 when the file gives no size. A size that
    // is no size matters only where there are boxes to place (an image without is packed).
    if (Status size = DeclaredSize(images[i], &item.declared_width, &item.declared_height);
        !size.ok() && !p.labels.empty()) {
      SF_RETURN_IF_ERROR(
          bad("images[" + std::to_string(i) + "]", "field 'image': " + size.message()));
      continue;
    }
    item.frame_from_size = true;
    item.values.resize(list.schema.size());
    const uint32_t n = static_cast<uint32_t>(p.labels.size());
    item.values[1] = OwnedValue::Array(p.boxes.data(), p.boxes.size() * 4, {n, 4});
    item.values[2] = OwnedValue::Array(p.labels.data(), p.labels.size() * 8, {n});
    item.values[3] = OwnedValue::Array(p.iscrowd.data(), p.iscrowd.size() * 8, {n});
    item.values[4] = OwnedValue::Array(p.category_ids.data(), p.category_ids.size() * 8, {n});
    int64_t id = 0;
    IdOf(images[i], "id", &id);
    item.values[5] = OwnedValue::Int64(id);
    if (captions) item.values[7] = OwnedValue::Text(p.captions.dump());
    list.items.push_back(std::move(item));
  }
  return list;
}

}  // namespace shardfeed::converter

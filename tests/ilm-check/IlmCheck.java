/*
 * flowstat's lifecycle configuration read by Elasticsearch's own ILM code (x-pack-core), for
 * tests/test_ilm_spec.py: the Elasticsearch the tests run (the Maven integ-test zip) has no ILM
 * module, so the policy cannot be PUT there; the classes that parse and check it on a server with
 * ILM are in x-pack-core's jar all the same.
 *
 * Usage: java -cp CLASSPATH IlmCheck REQUEST.json     (one JSON document out, on stdout)
 *
 * REQUEST: {"policies": [{"label": L, "name": POLICY_NAME, "file": PATH}, ...],
 *           "component_templates": {NAME: PATH, ...}, "index_templates": {NAME: PATH, ...},
 *           "indices": [INDEX_NAME, ...]}
 *
 * Answer:
 *  policies.L: what PUT _ilm/policy/POLICY_NAME does with the file's bytes up to its cluster-state
 *    update: PutLifecycleRequest.parseRequest (the REST layer's parser, with the lifecycle types and
 *    actions the ILM plugin registers), the request's validate() (LifecyclePolicy.validate, i.e.
 *    TimeseriesLifecycleType's phases, actions and their order; phase timings increasing), and
 *    LifecyclePolicy.validatePolicyName. {"ok": true, "policy": the parsed policy as Elasticsearch
 *    prints it, "min_age_ms": {PHASE: millis}, "actions": {PHASE: [action, ...] in the order ILM runs
 *    them]} or {"ok": false, "error": what Elasticsearch said}.
 *  component_templates.NAME: its template.settings, prefixed with "index." as PUT _component_template
 *    does, validated by an IndexScopedSettings holding the built-in index settings and the ILM
 *    plugin's index-scoped ones (unknown key or bad value: refused), each value read with its Setting:
 *    {"ok": true, "settings": {KEY: {"value": ..., "type": ..., "ilm_setting": "Class.CONSTANT" or
 *    null}}} or {"ok": false, "error": ...}.
 *  indices.NAME: {"templates": [index templates whose index_patterns match, Regex.simpleMatch as
 *    Elasticsearch matches them], "lifecycle_name": index.lifecycle.name of the settings the first
 *    match composes (its components in order, then its own), "parse_origination_date": the same for
 *    that setting, "created": what ILM's IndexLifecycleService.beforeIndexAddedToCluster says of an
 *    index created so ({"ok": true} or {"ok": false, "error": ...}), "name_date": what
 *    IndexLifecycleOriginationDateParser.parseIndexNameAndExtractDate says of the name itself
 *    ({"millis": N} or {"error": ...})}.
 */

import org.elasticsearch.action.ActionRequestValidationException;
import org.elasticsearch.common.Strings;
import org.elasticsearch.common.logging.LogConfigurator;
import org.elasticsearch.common.regex.Regex;
import org.elasticsearch.common.settings.IndexScopedSettings;
import org.elasticsearch.common.settings.Setting;
import org.elasticsearch.common.settings.Settings;
import org.elasticsearch.core.TimeValue;
import org.elasticsearch.index.IndexSettings;
import org.elasticsearch.xcontent.NamedXContentRegistry;
import org.elasticsearch.xcontent.ParseField;
import org.elasticsearch.xcontent.ToXContent;
import org.elasticsearch.xcontent.XContentBuilder;
import org.elasticsearch.xcontent.XContentParser;
import org.elasticsearch.xcontent.XContentParserConfiguration;
import org.elasticsearch.xcontent.json.JsonXContent;
import org.elasticsearch.xpack.core.ilm.AllocateAction;
import org.elasticsearch.xpack.core.ilm.DeleteAction;
import org.elasticsearch.xpack.core.ilm.DownsampleAction;
import org.elasticsearch.xpack.core.ilm.ForceMergeAction;
import org.elasticsearch.xpack.core.ilm.FreezeAction;
import org.elasticsearch.xpack.core.ilm.IndexLifecycleOriginationDateParser;
import org.elasticsearch.xpack.core.ilm.LifecycleAction;
import org.elasticsearch.xpack.core.ilm.LifecyclePolicy;
import org.elasticsearch.xpack.core.ilm.LifecycleSettings;
import org.elasticsearch.xpack.core.ilm.LifecycleType;
import org.elasticsearch.xpack.core.ilm.MigrateAction;
import org.elasticsearch.xpack.core.ilm.Phase;
import org.elasticsearch.xpack.core.ilm.ReadOnlyAction;
import org.elasticsearch.xpack.core.ilm.RolloverAction;
import org.elasticsearch.xpack.core.ilm.SearchableSnapshotAction;
import org.elasticsearch.xpack.core.ilm.SetPriorityAction;
import org.elasticsearch.xpack.core.ilm.ShrinkAction;
import org.elasticsearch.xpack.core.ilm.TimeseriesLifecycleType;
import org.elasticsearch.xpack.core.ilm.UnfollowAction;
import org.elasticsearch.xpack.core.ilm.WaitForSnapshotAction;
import org.elasticsearch.xpack.core.ilm.action.PutLifecycleRequest;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

public class IlmCheck {

    /** The lifecycle type and actions the ILM plugin (IndexLifecycle.getNamedXContent) registers:
     * every action x-pack-core defines, so an unknown one is unknown to Elasticsearch too. */
    static final NamedXContentRegistry REGISTRY = new NamedXContentRegistry(List.of(
        new NamedXContentRegistry.Entry(LifecycleType.class, new ParseField(TimeseriesLifecycleType.TYPE),
            (p, c) -> TimeseriesLifecycleType.INSTANCE),
        action(AllocateAction.NAME, AllocateAction::parse),
        action(ForceMergeAction.NAME, ForceMergeAction::parse),
        action(ReadOnlyAction.NAME, ReadOnlyAction::parse),
        action(RolloverAction.NAME, RolloverAction::parse),
        action(ShrinkAction.NAME, ShrinkAction::parse),
        action(DeleteAction.NAME, DeleteAction::parse),
        action(FreezeAction.NAME, FreezeAction::parse),
        action(SetPriorityAction.NAME, SetPriorityAction::parse),
        action(UnfollowAction.NAME, UnfollowAction::parse),
        action(WaitForSnapshotAction.NAME, WaitForSnapshotAction::parse),
        action(SearchableSnapshotAction.NAME, SearchableSnapshotAction::parse),
        action(MigrateAction.NAME, MigrateAction::parse),
        action(DownsampleAction.NAME, DownsampleAction::parse)));

    /** The ILM index settings, by the constant that defines them: those the ILM plugin registers
     * (IndexLifecycle.getSettings, index-scoped ones) and the two the server itself holds for it. */
    static final Map<Setting<?>, String> ILM_SETTINGS = new LinkedHashMap<>();
    static {
        ILM_SETTINGS.put(LifecycleSettings.LIFECYCLE_NAME_SETTING, "LifecycleSettings.LIFECYCLE_NAME_SETTING");
        ILM_SETTINGS.put(LifecycleSettings.LIFECYCLE_INDEXING_COMPLETE_SETTING,
            "LifecycleSettings.LIFECYCLE_INDEXING_COMPLETE_SETTING");
        ILM_SETTINGS.put(LifecycleSettings.LIFECYCLE_STEP_WAIT_TIME_THRESHOLD_SETTING,
            "LifecycleSettings.LIFECYCLE_STEP_WAIT_TIME_THRESHOLD_SETTING");
        ILM_SETTINGS.put(LifecycleSettings.LIFECYCLE_SKIP_SETTING, "LifecycleSettings.LIFECYCLE_SKIP_SETTING");
        ILM_SETTINGS.put(LifecycleSettings.LIFECYCLE_ROLLOVER_ONLY_IF_HAS_DOCUMENTS_SETTING,
            "LifecycleSettings.LIFECYCLE_ROLLOVER_ONLY_IF_HAS_DOCUMENTS_SETTING");
        ILM_SETTINGS.put(RolloverAction.LIFECYCLE_ROLLOVER_ALIAS_SETTING, "RolloverAction.LIFECYCLE_ROLLOVER_ALIAS_SETTING");
        ILM_SETTINGS.put(IndexSettings.LIFECYCLE_ORIGINATION_DATE_SETTING, "IndexSettings.LIFECYCLE_ORIGINATION_DATE_SETTING");
        ILM_SETTINGS.put(IndexSettings.LIFECYCLE_PARSE_ORIGINATION_DATE_SETTING,
            "IndexSettings.LIFECYCLE_PARSE_ORIGINATION_DATE_SETTING");
    }

    static IndexScopedSettings INDEX_SETTINGS;  // made in main, once logging is there

    static IndexScopedSettings indexSettings() {
        Set<Setting<?>> known = new HashSet<>(IndexScopedSettings.BUILT_IN_INDEX_SETTINGS);
        for (Setting<?> s : ILM_SETTINGS.keySet()) {
            if (s.hasIndexScope()) {
                known.add(s);
            }
        }
        return new IndexScopedSettings(Settings.EMPTY, known);
    }

    static NamedXContentRegistry.Entry action(
        String name, org.elasticsearch.core.CheckedFunction<XContentParser, ? extends LifecycleAction, IOException> parse) {
        return new NamedXContentRegistry.Entry(LifecycleAction.class, new ParseField(name), parse);
    }

    public static void main(String[] args) throws Exception {
        LogConfigurator.configureESLogging();  // the server's classes log through it (as the node sets it up)
        INDEX_SETTINGS = indexSettings();
        Map<String, Object> request = readJson(Path.of(args[0]));
        XContentBuilder out = JsonXContent.contentBuilder().prettyPrint();
        out.startObject();

        out.startObject("policies");
        for (Object o : (List<?>) request.getOrDefault("policies", List.of())) {
            Map<?, ?> p = (Map<?, ?>) o;
            out.startObject((String) p.get("label"));
            policy(out, (String) p.get("name"), Path.of((String) p.get("file")));
            out.endObject();
        }
        out.endObject();

        Map<String, Settings> components = new LinkedHashMap<>();
        out.startObject("component_templates");
        for (Map.Entry<?, ?> e : ((Map<?, ?>) request.getOrDefault("component_templates", Map.of())).entrySet()) {
            out.startObject((String) e.getKey());
            components.put((String) e.getKey(), componentSettings(out, Path.of((String) e.getValue())));
            out.endObject();
        }
        out.endObject();

        Map<String, Map<String, Object>> templates = new LinkedHashMap<>();
        for (Map.Entry<?, ?> e : ((Map<?, ?>) request.getOrDefault("index_templates", Map.of())).entrySet()) {
            templates.put((String) e.getKey(), readJson(Path.of((String) e.getValue())));
        }
        out.startObject("indices");
        for (Object name : (List<?>) request.getOrDefault("indices", List.of())) {
            out.startObject((String) name);
            index(out, (String) name, templates, components);
            out.endObject();
        }
        out.endObject();

        out.endObject();
        System.out.println(Strings.toString(out));
    }

    static Map<String, Object> readJson(Path path) throws IOException {
        try (XContentParser parser = JsonXContent.jsonXContent.createParser(XContentParserConfiguration.EMPTY,
            Files.readAllBytes(path))) {
            return parser.mapOrdered();
        }
    }

    /** PUT _ilm/policy/NAME with the file as its body, as far as it goes without a cluster. */
    static void policy(XContentBuilder out, String name, Path file) throws IOException {
        LifecyclePolicy policy;
        try (XContentParser parser = JsonXContent.jsonXContent.createParser(
            XContentParserConfiguration.EMPTY.withRegistry(REGISTRY), Files.readAllBytes(file))) {
            PutLifecycleRequest request = PutLifecycleRequest.parseRequest(new PutLifecycleRequest.Factory() {
                @Override
                public PutLifecycleRequest create(LifecyclePolicy lifecyclePolicy) {
                    return new PutLifecycleRequest(TimeValue.THIRTY_SECONDS, TimeValue.THIRTY_SECONDS, lifecyclePolicy);
                }

                @Override
                public String getPolicyName() {
                    return name;
                }
            }, parser);
            ActionRequestValidationException invalid = request.validate();
            if (invalid != null) {
                throw invalid;
            }
            policy = request.getPolicy();
            LifecyclePolicy.validatePolicyName(policy.getName());
        } catch (Exception e) {
            out.field("ok", false).field("error", describe(e));
            return;
        }
        out.field("ok", true);
        out.field("name", policy.getName());
        out.field("policy");
        policy.toXContent(out, ToXContent.EMPTY_PARAMS);
        out.startObject("min_age_ms");
        for (Phase phase : TimeseriesLifecycleType.INSTANCE.getOrderedPhases(policy.getPhases())) {
            out.field(phase.getName(), phase.getMinimumAge().millis());
        }
        out.endObject();
        out.startObject("actions");
        for (Phase phase : TimeseriesLifecycleType.INSTANCE.getOrderedPhases(policy.getPhases())) {
            out.startArray(phase.getName());
            for (LifecycleAction a : TimeseriesLifecycleType.INSTANCE.getOrderedActions(phase)) {
                out.value(a.getWriteableName());
            }
            out.endArray();
        }
        out.endObject();
    }

    /** A component template's settings, checked as an index's settings are; null when refused. */
    static Settings componentSettings(XContentBuilder out, Path file) throws IOException {
        Map<String, Object> doc = readJson(file);
        Object template = doc.get("template");
        Object raw = template instanceof Map<?, ?> t ? t.get("settings") : null;
        @SuppressWarnings("unchecked")
        Map<String, Object> settingsMap = raw instanceof Map<?, ?> m ? (Map<String, Object>) m : Map.of();
        Settings settings;
        Map<String, Object[]> read = new LinkedHashMap<>();
        try {
            settings = Settings.builder().loadFromMap(settingsMap).normalizePrefix("index.").build();
            INDEX_SETTINGS.validate(settings, true);
            for (String key : settings.keySet()) {
                Setting<?> setting = INDEX_SETTINGS.get(key);
                Object value = setting.get(settings);
                read.put(key, new Object[] { value, ILM_SETTINGS.get(setting) });
            }
        } catch (Exception e) {
            out.field("ok", false).field("error", describe(e));
            return null;
        }
        out.field("ok", true);
        out.startObject("settings");
        for (Map.Entry<String, Object[]> e : read.entrySet()) {
            Object value = e.getValue()[0];
            out.startObject(e.getKey());
            out.field("value", value instanceof Boolean b ? (Object) b : String.valueOf(value));
            out.field("type", value == null ? null : value.getClass().getSimpleName());
            out.field("ilm_setting", (String) e.getValue()[1]);
            out.endObject();
        }
        out.endObject();
        return settings;
    }

    /** Which index templates take an index of this name, what ILM makes of its settings and name. */
    static void index(XContentBuilder out, String name, Map<String, Map<String, Object>> templates,
                      Map<String, Settings> components) throws IOException {
        List<String> matched = new ArrayList<>();
        for (Map.Entry<String, Map<String, Object>> t : templates.entrySet()) {
            List<String> patterns = new ArrayList<>();
            for (Object p : (List<?>) t.getValue().get("index_patterns")) {
                patterns.add((String) p);
            }
            if (Regex.simpleMatch(patterns, name)) {
                matched.add(t.getKey());
            }
        }
        out.array("templates", matched.toArray(new String[0]));
        if (matched.isEmpty() == false) {
            Map<String, Object> template = templates.get(matched.get(0));
            Settings.Builder composed = Settings.builder();
            String missing = null;
            for (Object c : (List<?>) template.getOrDefault("composed_of", List.of())) {
                Settings s = components.get((String) c);
                if (s == null) {  // as Elasticsearch refuses an index template whose component is not there
                    missing = "index template [" + matched.get(0) + "] is composed of [" + c
                        + "], a component template not given or refused";
                    break;
                }
                composed.put(s);
            }
            if (missing != null) {
                out.nullField("lifecycle_name").nullField("parse_origination_date");
                out.startObject("created").field("ok", false).field("error", missing).endObject();
            } else {
                Object own = template.get("template");
                if (own instanceof Map<?, ?> o && o.get("settings") instanceof Map<?, ?> s) {
                    @SuppressWarnings("unchecked")
                    Map<String, Object> m = (Map<String, Object>) s;
                    composed.put(Settings.builder().loadFromMap(m).normalizePrefix("index.").build());
                }
                Settings settings = composed.build();
                out.field("lifecycle_name", LifecycleSettings.LIFECYCLE_NAME_SETTING.get(settings));
                out.field("parse_origination_date", IndexLifecycleOriginationDateParser.shouldParseIndexName(settings));
                out.startObject("created");
                try {
                    // IndexLifecycleService.beforeIndexAddedToCluster: ILM's check of every new index
                    if (IndexLifecycleOriginationDateParser.shouldParseIndexName(settings)) {
                        IndexLifecycleOriginationDateParser.parseIndexNameAndExtractDate(name);
                    }
                    out.field("ok", true);
                } catch (Exception e) {
                    out.field("ok", false).field("error", describe(e));
                }
                out.endObject();
            }
        }
        out.startObject("name_date");
        try {
            out.field("millis", IndexLifecycleOriginationDateParser.parseIndexNameAndExtractDate(name));
        } catch (Exception e) {
            out.field("error", describe(e));
        }
        out.endObject();
    }

    static String describe(Throwable e) {
        StringBuilder b = new StringBuilder();
        for (Throwable t = e; t != null; t = t.getCause() == t ? null : t.getCause()) {
            if (b.length() > 0) {
                b.append(" <- ");
            }
            b.append(t.getClass().getSimpleName()).append(": ").append(t.getMessage());
        }
        return b.toString();
    }
}

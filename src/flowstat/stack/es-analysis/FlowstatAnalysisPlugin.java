/*
 * The analysis components Elasticsearch's .security index needs, for the integ-test zip.
 *
 * The .security index's `email` analyzer (x-pack-security's SecuritySystemIndices) is
 *   tokenizer uax_url_email, filters [email: pattern_capture, lowercase, unique].
 * `lowercase` is in Elasticsearch's core; the other three live in the analysis-common module, which
 * the integ-test zip does not hold (nor does Maven Central), so every native-realm write (roles,
 * users, API keys) fails with "Unknown filter type [pattern_capture] for [email]". This module
 * registers them over the Lucene classes already in lib/ (lucene-analysis-common), with the
 * settings analysis-common reads. flowstat compiles it at install time against that very lib/
 * (javac --release 17 -cp "lib/*"): the plugin API is internal and tied to the version.
 */
package org.flowstat.esanalysis;

import java.io.IOException;
import java.util.List;
import java.util.Map;
import java.util.regex.Pattern;

import org.apache.lucene.analysis.CharArraySet;
import org.apache.lucene.analysis.TokenFilter;
import org.apache.lucene.analysis.TokenStream;
import org.apache.lucene.analysis.Tokenizer;
import org.apache.lucene.analysis.email.UAX29URLEmailTokenizer;
import org.apache.lucene.analysis.pattern.PatternCaptureGroupTokenFilter;
import org.apache.lucene.analysis.standard.StandardAnalyzer;
import org.apache.lucene.analysis.tokenattributes.CharTermAttribute;
import org.apache.lucene.analysis.tokenattributes.PositionIncrementAttribute;
import org.elasticsearch.common.settings.Settings;
import org.elasticsearch.index.IndexSettings;
import org.elasticsearch.index.analysis.AbstractTokenFilterFactory;
import org.elasticsearch.index.analysis.AbstractTokenizerFactory;
import org.elasticsearch.index.analysis.TokenFilterFactory;
import org.elasticsearch.index.analysis.TokenizerFactory;
import org.elasticsearch.indices.analysis.AnalysisModule.AnalysisProvider;
import org.elasticsearch.plugins.AnalysisPlugin;
import org.elasticsearch.plugins.Plugin;

public class FlowstatAnalysisPlugin extends Plugin implements AnalysisPlugin {

    @Override
    public Map<String, AnalysisProvider<TokenizerFactory>> getTokenizers() {
        return Map.of("uax_url_email", UaxUrlEmailTokenizerFactory::new);
    }

    @Override
    public Map<String, AnalysisProvider<TokenFilterFactory>> getTokenFilters() {
        return Map.of(
            "pattern_capture", AnalysisPlugin.requiresAnalysisSettings(PatternCaptureTokenFilterFactory::new),
            "unique", UniqueTokenFilterFactory::new);
    }

    /** uax_url_email: StandardTokenizer's rules, plus URLs and e-mail addresses as single tokens. */
    static final class UaxUrlEmailTokenizerFactory extends AbstractTokenizerFactory {
        private final int maxTokenLength;

        UaxUrlEmailTokenizerFactory(IndexSettings indexSettings, org.elasticsearch.env.Environment env, String name,
                                    Settings settings) {
            super(indexSettings, settings, name);
            maxTokenLength = settings.getAsInt("max_token_length", StandardAnalyzer.DEFAULT_MAX_TOKEN_LENGTH);
        }

        @Override
        public Tokenizer create() {
            UAX29URLEmailTokenizer tokenizer = new UAX29URLEmailTokenizer();
            tokenizer.setMaxTokenLength(maxTokenLength);
            return tokenizer;
        }
    }

    /** pattern_capture: a token for each capture group of each pattern (and the original, by default). */
    static final class PatternCaptureTokenFilterFactory extends AbstractTokenFilterFactory {
        private final Pattern[] patterns;
        private final boolean preserveOriginal;

        PatternCaptureTokenFilterFactory(IndexSettings indexSettings, org.elasticsearch.env.Environment env, String name,
                                         Settings settings) {
            super(name, settings);
            List<String> regexes = settings.getAsList("patterns");
            if (regexes.isEmpty()) {
                throw new IllegalArgumentException("required setting 'patterns' is missing for token filter [" + name + "]");
            }
            patterns = regexes.stream().map(Pattern::compile).toArray(Pattern[]::new);
            preserveOriginal = settings.getAsBoolean("preserve_original", true);
        }

        @Override
        public TokenStream create(TokenStream tokenStream) {
            return new PatternCaptureGroupTokenFilter(tokenStream, preserveOriginal, patterns);
        }
    }

    /** unique: drops a token whose term came before (only at the same position, if so set). */
    static final class UniqueTokenFilterFactory extends AbstractTokenFilterFactory {
        private final boolean onlyOnSamePosition;

        UniqueTokenFilterFactory(IndexSettings indexSettings, org.elasticsearch.env.Environment env, String name,
                                 Settings settings) {
            super(name, settings);
            onlyOnSamePosition = settings.getAsBoolean("only_on_same_position", false);
        }

        @Override
        public TokenStream create(TokenStream tokenStream) {
            return new UniqueTokenFilter(tokenStream, onlyOnSamePosition);
        }
    }

    static final class UniqueTokenFilter extends TokenFilter {
        private final CharTermAttribute termAttribute = addAttribute(CharTermAttribute.class);
        private final PositionIncrementAttribute positionIncrement = addAttribute(PositionIncrementAttribute.class);
        private final CharArraySet previous = new CharArraySet(8, false);
        private final boolean onlyOnSamePosition;

        UniqueTokenFilter(TokenStream in, boolean onlyOnSamePosition) {
            super(in);
            this.onlyOnSamePosition = onlyOnSamePosition;
        }

        @Override
        public boolean incrementToken() throws IOException {
            while (input.incrementToken()) {
                char[] term = termAttribute.buffer();
                int length = termAttribute.length();
                boolean duplicate;
                if (onlyOnSamePosition) {
                    if (positionIncrement.getPositionIncrement() > 0) {
                        previous.clear();
                    }
                    duplicate = positionIncrement.getPositionIncrement() == 0 && previous.contains(term, 0, length);
                } else {
                    duplicate = previous.contains(term, 0, length);
                }
                char[] saved = new char[length];
                System.arraycopy(term, 0, saved, 0, length);
                previous.add(saved);
                if (!duplicate) {
                    return true;
                }
            }
            return false;
        }

        @Override
        public void reset() throws IOException {
            super.reset();
            previous.clear();
        }
    }
}
